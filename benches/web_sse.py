"""What chat over HTTP + Server-Sent Events costs on top of gRPC `Chat`, measured in the same run.

The five services run as `agentmesh serve` processes (as `agentmesh up` runs them) and the model
server in a process of its own that answers at once, so what differs between the two columns is
only the path from the gateway to the client:

- **grpc**: `Gateway.Chat` read by a gRPC client;
- **sse**: `POST /v1/sessions/{id}/chat` read by an HTTP client (httpx + httpx-sse), which the
  gateway serves by calling its own gRPC `Chat` over loopback and writing each event as an SSE
  message (plus the two `GetSession` calls that give the stream its resumable ids).

Two turns: **tool** (two model calls and one jailed `shell` process, 5 events) and
**chatty** (one model answer streamed as 200 text deltas, 202 events). The two transports
alternate turn by turn so that drift in the machine hits both alike.

    python -m benches.web_sse [--turns 40]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from httpx_sse import aconnect_sse

from agentmesh.cli.stack import LocalStack, free_address
from agentmesh.config import SERVICES
from agentmesh.rpc.client import open_channel
from agentmesh.v1 import gateway_pb2, gateway_pb2_grpc
from tests.support.llm_server import ScriptedLLMServer, reply, tool_call

CHATTY_TEXT = "word " * 200  # 1000 characters in 5-character deltas


def respond(request):
    last = request.body["messages"][-1]
    if last["role"] == "tool":
        return reply("done", chunk_chars=64)
    if "chatty" in str(last.get("content", "")):
        return reply(CHATTY_TEXT, chunk_chars=5)
    return reply("", tool_call("shell", {"command": "true"}), chunk_chars=64)


def _serve_llm(port_out, stop) -> None:
    with ScriptedLLMServer(default=respond) as llm:
        port_out.put(llm.base_url)
        stop.wait()


async def grpc_turn(stub, session_id: str, message: str) -> tuple[float, float, int]:
    started = time.perf_counter()
    first = 0.0
    count = 0
    async for _event in stub.Chat(gateway_pb2.ChatRequest(session_id=session_id, message=message), timeout=60):
        count += 1
        first = first or time.perf_counter() - started
    return first, time.perf_counter() - started, count


async def sse_turn(client: httpx.AsyncClient, session_id: str, message: str) -> tuple[float, float, int]:
    started = time.perf_counter()
    first = 0.0
    count = 0
    async with aconnect_sse(client, "POST", f"/v1/sessions/{session_id}/chat", json={"message": message}) as source:
        async for _message in source.aiter_sse():
            count += 1
            first = first or time.perf_counter() - started
    return first, time.perf_counter() - started, count


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def main_async(args) -> None:
    ctx = multiprocessing.get_context("spawn")
    port_out, stop = ctx.Queue(), ctx.Event()
    llm_process = ctx.Process(target=_serve_llm, args=(port_out, stop), daemon=True)
    llm_process.start()
    base_url = port_out.get(timeout=30)
    home = Path(tempfile.mkdtemp(prefix="agentmesh-bench-"))
    os.chmod(home, 0o755)
    env = {**os.environ, "AGENTMESH_HOME": str(home / "platform"), "AGENTMESH_LLM_PROVIDER": "openai",
           "AGENTMESH_LLM_BASE_URL": base_url, "AGENTMESH_LLM_MODEL": "bench", "AGENTMESH_LOG_LEVEL": "warning"}
    env.update({f"AGENTMESH_{name.upper()}_ADDR": free_address() for name in SERVICES})
    env["AGENTMESH_GATEWAY_HTTP_ADDR"] = free_address()
    stack = LocalStack(env, log_dir=home / "logs")
    stack.start()
    results: dict[tuple[str, str], list[tuple[float, float, int]]] = {}
    try:
        await stack.wait_healthy()
        async with open_channel(stack.settings.address_of("gateway")) as channel, \
                httpx.AsyncClient(base_url=stack.console_url.rstrip("/"), timeout=60) as client:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            for turn, message in (("tool", "run true"), ("chatty", "be chatty")):
                # Warm-up: connections, first-call costs, the jail's first start.
                await grpc_turn(stub, f"warm-g-{turn}", message)
                await sse_turn(client, f"warm-s-{turn}", message)
                for i in range(args.turns):
                    # A fresh session per turn: transcripts do not grow across the run.
                    g = await grpc_turn(stub, f"g-{turn}-{i}", message)
                    s = await sse_turn(client, f"s-{turn}-{i}", message)
                    results.setdefault((turn, "grpc"), []).append(g)
                    results.setdefault((turn, "sse"), []).append(s)
    finally:
        await asyncio.to_thread(stack.stop)
        stop.set()
        llm_process.join(timeout=5)

    print(f"\n{args.turns} turns of each kind per transport, alternating; times in ms\n")
    print(f"{'turn':<7} {'transport':<9} {'events':>6} {'first event p50':>15} {'turn p50':>9} {'turn p95':>9} {'mean':>8}")
    extra: dict[str, float] = {}
    for turn in ("tool", "chatty"):
        medians = {}
        for transport in ("grpc", "sse"):
            rows = results[(turn, transport)]
            firsts = [r[0] * 1000 for r in rows]
            totals = [r[1] * 1000 for r in rows]
            medians[transport] = percentile(totals, 0.5)
            print(f"{turn:<7} {transport:<9} {rows[0][2]:>6} {percentile(firsts, 0.5):>15.1f} "
                  f"{percentile(totals, 0.5):>9.1f} {percentile(totals, 0.95):>9.1f} {statistics.mean(totals):>8.1f}")
        extra[turn] = medians["sse"] - medians["grpc"]
        print(f"{turn:<7} {'sse-grpc':<9} {'':>6} {'':>15} {extra[turn]:>+9.1f}   (p50 difference per turn)")
    # What one more event costs over SSE: the chatty turn's extra cost beyond the tool turn's,
    # spread over the extra events (the fixed per-turn part cancels out).
    more_events = results[("chatty", "grpc")][0][2] - results[("tool", "grpc")][0][2]
    print(f"\nper event over SSE (marginal): {(extra['chatty'] - extra['tool']) / more_events * 1000:+.0f} µs; "
          f"per turn (fixed): {extra['tool']:+.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=40)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
