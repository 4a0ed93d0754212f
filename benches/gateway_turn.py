"""What the gateway itself costs to relay one turn, in CPU: `Gateway.Chat` in, `Agent/RunTurn`
out (a stream-stream call), the turn's events back.

The gateway is a real `agentmesh serve gateway` process (local tracing on, signed calls, as in
`agentmesh up`); the agent it calls is a stand-in in this process that answers every `RunTurn`
with the five events of the turn bench's turn (run_started, tool_call, tool_result, text_delta,
run_finished), a millisecond apart and with no work between them. Nothing else runs, so the
gateway's CPU (read from `/proc`) is all its own: the median over `--rounds` rounds of
`--turns` turns one after the other.

    python -m benches.gateway_turn [--turns 1000] [--rounds 5] [--before-python ../main/.venv/bin/python]

With `--before-python`, a second gateway runs under that interpreter (another checkout's code)
against the same stand-in; rounds alternate between the gateways so that the load of a shared
machine falls on both alike.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import grpc

from agentmesh.internal.v1 import agent_service_pb2_grpc
from agentmesh.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from benches._contenders import cpu_s, free_address

EVENT_GAP_S = 0.001


class _InstantAgent(agent_service_pb2_grpc.AgentServicer):
    """The agent's side of RunTurn, with no work in it: the turn's five events, then the end."""

    async def RunTurn(self, request_iterator, context):
        run = await anext(aiter(request_iterator))
        ids = {"session_id": run.session_id, "run_id": run.run_id}
        payloads = [
            {"run_started": common_pb2.RunStarted(**ids, namespace=run.namespace or "default")},
            {"tool_call": common_pb2.ToolCallStarted(call_id="call-1", name="shell", arguments_json='{"command": "true"}')},
            {"tool_result": common_pb2.ToolCallFinished(result=common_pb2.ToolResult(call_id="call-1", name="shell", output=""))},
            {"text_delta": common_pb2.TextDelta(text="done")},
            {"run_finished": common_pb2.RunFinished(stop_reason="completed", final_text="done")},
        ]
        for seq, payload in enumerate(payloads, start=1):
            if seq > 1:
                # A real turn's events come milliseconds apart (model calls, the tool): each
                # one wakes the gateway on its own, as here.
                await asyncio.sleep(EVENT_GAP_S)
            yield common_pb2.Event(**ids, seq=seq, timestamp=time.time(), **payload)


def _start_gateway(python: str, agent: str) -> tuple[subprocess.Popen, str, str]:
    home = tempfile.mkdtemp(prefix="agentmesh-gateway-turn-")
    address = free_address()
    env = {**os.environ, "AGENTMESH_HOME": home, "AGENTMESH_GATEWAY_ADDR": address, "AGENTMESH_AGENT_ADDR": agent,
           "AGENTMESH_GATEWAY_HTTP_ADDR": free_address(), "AGENTMESH_TRACES": "local", "AGENTMESH_LOG_LEVEL": "warning"}
    # From outside any checkout, so that the interpreter's own install of agentmesh is used.
    process = subprocess.Popen([python, "-m", "agentmesh.cli.main", "serve", "gateway"], env=env,
                               cwd=tempfile.gettempdir())
    return process, address, home


async def _turns(stub: gateway_pb2_grpc.GatewayStub, count: int) -> None:
    for n in range(count):
        kinds = [e.WhichOneof("payload") async for e in stub.Chat(
            gateway_pb2.ChatRequest(session_id=f"s{n % 8}", message="run true"), timeout=30)]
        if kinds[-1] != "run_finished":
            raise RuntimeError(f"unexpected turn: {kinds}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--before-python", default="", help="also run a gateway with this interpreter (another checkout)")
    args = parser.parse_args()

    agent = grpc.aio.server()
    agent_service_pb2_grpc.add_AgentServicer_to_server(_InstantAgent(), agent)
    agent_address = f"127.0.0.1:{agent.add_insecure_port('127.0.0.1:0')}"
    await agent.start()
    pythons = {"before": args.before_python} if args.before_python else {}
    pythons["agentmesh"] = sys.executable
    gateways = {name: _start_gateway(python, agent_address) for name, python in pythons.items()}
    load = os.getloadavg()[0]
    try:
        stubs = {}
        for name, (_, address, _) in gateways.items():
            channel = grpc.aio.insecure_channel(address)
            await asyncio.wait_for(channel.channel_ready(), 60)
            stubs[name] = gateway_pb2_grpc.GatewayStub(channel)
            await _turns(stubs[name], 200)  # warm: connections, caches, the signed token
        per_turn: dict[str, list[float]] = {name: [] for name in gateways}
        names = list(gateways)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:
                pid = gateways[name][0].pid
                before = cpu_s(pid)
                await _turns(stubs[name], args.turns)
                per_turn[name].append((cpu_s(pid) - before) / args.turns * 1000)
    finally:
        for process, _, home in gateways.values():
            process.terminate()
            process.wait(30)
            shutil.rmtree(home, ignore_errors=True)
        await agent.stop(None)
    print(f"the gateway's CPU per relayed turn (Chat in, RunTurn out, 5 events back; local tracing), {args.turns} "
          f"turns one after the other, median of {args.rounds} alternating rounds; load average {load:.2f} at the "
          f"start, {os.getloadavg()[0]:.2f} at the end\n")
    print("| gateway | CPU / turn | rounds |")
    print("| --- | --- | --- |")
    for name, values in per_turn.items():
        print(f"| {name} | {statistics.median(values):.3f} ms | {', '.join(f'{v:.2f}' for v in values)} |")


if __name__ == "__main__":
    asyncio.run(main())
