"""What session routing costs: a turn and a Cancel served by the session's owner replica, beside
the same calls made through the other replica, which forwards them (one extra gRPC hop).

Two gateway replicas with a static peer list in front of one agent, tools and memory, all in
this process on 127.0.0.1; the model server answers at once with a short text reply, so what is
measured is the gateway tier. Calls alternate between the two paths so both see the same
machine state. The baseline is the owner path, measured in the same run.

    python -m benches.gateway_routing [--turns 200] [--cancels 500]
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import tempfile
import time
from pathlib import Path

from agentmesh.logs import configure_logging
from agentmesh.v1 import gateway_pb2
from tests.gateway_routing.replicas import BACKENDS, Replicas
from tests.support.llm_server import ScriptedLLMServer, reply
from tests.support.stack import Stack

OWNER, OTHER = 0, 1


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def timed_turn(stub, session_id: str) -> float:
    started = time.perf_counter()
    kinds = [e.WhichOneof("payload") async for e in stub.Chat(gateway_pb2.ChatRequest(session_id=session_id, message="hi"), timeout=60)]
    if kinds[-1] != "run_finished":
        raise RuntimeError(f"unexpected turn: {kinds}")
    return time.perf_counter() - started


async def timed_cancel(stub, session_id: str) -> float:
    started = time.perf_counter()
    await stub.Cancel(gateway_pb2.CancelRequest(session_id=session_id), timeout=10)
    return time.perf_counter() - started


async def run(turns: int, cancels: int) -> dict[str, list[float]]:
    with ScriptedLLMServer(default=lambda request: reply("ok", chunk_chars=64)) as llm, \
            tempfile.TemporaryDirectory() as home:
        env = {"AGENTMESH_TRACES": "none"}
        async with Stack(Path(home), llm_base_url=llm.base_url, env=env, services=BACKENDS) as backends, \
                Replicas(backends, count=2) as replicas:
            owner, other = replicas.stub(OWNER), replicas.stub(OTHER)
            sessions = [replicas.session_owned_by(OWNER, prefix=f"b{n}") for n in range(8)]
            for session in sessions:  # warm up: sessions created, channels connected
                await timed_turn(owner, session)
                await timed_turn(other, session)
            results: dict[str, list[float]] = {k: [] for k in ("turn-owner", "turn-forwarded", "cancel-owner", "cancel-forwarded")}
            for n in range(turns):
                session = sessions[n % len(sessions)]
                results["turn-owner"].append(await timed_turn(owner, session))
                results["turn-forwarded"].append(await timed_turn(other, session))
            for n in range(cancels):
                session = sessions[n % len(sessions)]
                results["cancel-owner"].append(await timed_cancel(owner, session))
                results["cancel-forwarded"].append(await timed_cancel(other, session))
            return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--cancels", type=int, default=500)
    args = parser.parse_args()
    configure_logging("bench", "error")  # the table, not a log line per turn
    results = asyncio.run(run(args.turns, args.cancels))
    print(f"# gateway session routing — {platform.machine()}, {args.turns} turns, {args.cancels} cancels per path")
    print(f"{'call':<18} {'n':>5} {'p50 ms':>8} {'p95 ms':>8} {'mean ms':>8}")
    for name, values in results.items():
        ms = [v * 1000 for v in values]
        print(f"{name:<18} {len(ms):>5} {percentile(ms, 0.5):>8.2f} {percentile(ms, 0.95):>8.2f} {statistics.mean(ms):>8.2f}")
    for call in ("turn", "cancel"):
        extra = statistics.median(results[f"{call}-forwarded"]) - statistics.median(results[f"{call}-owner"])
        print(f"forwarding adds {extra * 1000:.2f} ms to a {call} (median)")


if __name__ == "__main__":
    main()
