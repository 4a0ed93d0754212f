"""What the memory service costs per agent turn, in CPU and latency, apart from the rest of the stack.

A real memory service (`agentmesh serve memory`, its own process, local tracing on, embedded
Qdrant Edge) gets the calls one tool-using turn of `benches/turn_overhead.py` makes of it, signed
as the services that make them:

- the gateway's `PutSession` (with the namespace's settings);
- the agent's `StartTurn` (transcript read, the user's message appended, recall of 5, the
  learning reads: profile, skills, promoted tools);
- three `AppendMessages` (the model's tool call with its usage record, the tool's result, the
  model's answer with its usage record).

Turns go round `--sessions` sessions, so transcripts grow as in the turn bench. CPU is read from
`/proc` for the service; latency is each call's as the client sees it. Median of `--rounds`
rounds of `--turns` turns.

    python -m benches.memory_turn [--turns 300] [--rounds 3] [--sessions 8] [--before-python ../main/.venv/bin/python]

Each contender runs in a child process with its interpreter (so a checkout's service is
measured); rounds alternate between contenders, so the load of a shared machine falls on all
of them alike.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time

if __package__:  # python -m benches.memory_turn
    from benches._contenders import alternate, cpu_s, free_address, serve_rounds, service, start
else:  # a contender: this file run by path under another checkout's interpreter (benches/_contenders.py)
    from _contenders import alternate, cpu_s, free_address, serve_rounds, service, start

MEASURED_TO = "memory_turn_result:"
CALLS = ("PutSession", "StartTurn", "AppendMessages")


async def _child(turns: int, sessions: int) -> None:
    """Serve and call; then, for each line read on stdin, one round of turns; print its result."""
    from agentmesh.config import Settings
    from agentmesh.internal.v1 import memory_service_pb2, memory_service_pb2_grpc
    from agentmesh.rpc.client import open_channel
    from agentmesh.rpc.identity import ServiceIdentity
    from agentmesh.telemetry import setup_telemetry
    from agentmesh.v1 import common_pb2, sessions_pb2

    home = tempfile.mkdtemp(prefix="agentmesh-memory-turn-")
    address = free_address()
    env = {**os.environ, "AGENTMESH_HOME": home, "AGENTMESH_MEMORY_ADDR": address, "AGENTMESH_TRACES": "local",
           "AGENTMESH_LOG_LEVEL": "warning"}
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, home, ignore_errors=True)
        memory = cleanup.enter_context(service("memory", env))
        settings = Settings.from_env({"AGENTMESH_HOME": home, "AGENTMESH_TRACES": "local"})
        telemetry = setup_telemetry("agent", settings)
        channels = {name: open_channel(address, telemetry, identity=ServiceIdentity.open(name, settings.keys_dir),
                                       audience="memory") for name in ("gateway", "agent")}
        for channel in channels.values():
            await asyncio.wait_for(channel.channel_ready(), 60)
        gateway, agent = (memory_service_pb2_grpc.MemoryStub(channels[n]) for n in ("gateway", "agent"))
        played = 0

        async def turn(latencies: dict[str, list[float]]) -> None:
            nonlocal played
            session_id, run_id = f"s{played % sessions}", f"run-{played}"
            played += 1

            async def timed(name: str, call) -> None:
                started = time.perf_counter()
                await call
                latencies[name].append(time.perf_counter() - started)

            def usage(n: int) -> memory_service_pb2.UsageRecord:
                return memory_service_pb2.UsageRecord(id=f"{run_id}:{n}", at=time.time(), session_id=session_id, run_id=run_id,
                                              namespace="default", model_name="default", model="bench",
                                              provider="openai", input_tokens=120, output_tokens=12)

            call = common_pb2.ToolCall(call_id=f"call-{played}", name="shell", arguments_json='{"command": "true"}')
            await timed("PutSession", gateway.PutSession(memory_service_pb2.PutSessionRequest(
                session=sessions_pb2.Session(session_id=session_id), with_namespace_settings=True), timeout=30))
            await timed("StartTurn", agent.StartTurn(memory_service_pb2.StartTurnRequest(
                session_id=session_id, messages=[common_pb2.Message(role="user", content="run true", run_id=run_id)],
                page_size=1000, namespace="default", recall_query="run true", recall_k=5, recall_timeout_s=5,
                with_profile=True, with_skills=True, with_promoted_tools=True), timeout=30))
            for messages, records in (
                ([common_pb2.Message(role="assistant", tool_calls=[call], run_id=run_id)], [usage(1)]),
                ([common_pb2.Message(role="tool", content="", tool_call_id=call.call_id, name="shell",
                                     run_id=run_id)], []),
                ([common_pb2.Message(role="assistant", content="done", run_id=run_id)], [usage(2)]),
            ):
                await timed("AppendMessages", agent.AppendMessages(memory_service_pb2.AppendMessagesRequest(
                    session_id=session_id, messages=messages, usage=records), timeout=30))

        warm = {name: [] for name in CALLS}
        for _ in range(2 * sessions):  # warm: connections, the checked tokens, every session created
            await turn(warm)

        async def measure() -> dict[str, float]:
            latencies: dict[str, list[float]] = {name: [] for name in CALLS}
            service0 = cpu_s(memory.pid)
            for _ in range(turns):
                await turn(latencies)
            service1 = cpu_s(memory.pid)
            return {
                "service_ms": (service1 - service0) / turns * 1000,
                **{f"{name}_ms": statistics.median(values) * 1000 for name, values in latencies.items()},
                "messages": 4 * played // sessions,
            }

        await serve_rounds(MEASURED_TO, measure)
        for channel in channels.values():
            await channel.close()
        telemetry.shutdown()


def _contender(python: str, turns: int, sessions: int):
    return start(python, __file__, ["--child", "--turns", str(turns), "--sessions", str(sessions)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=8, help="sessions the turns go round (transcripts grow)")
    parser.add_argument("--before-python", default="", help="also measure another checkout's interpreter (and code)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        asyncio.run(_child(args.turns, args.sessions))
        return

    contenders = {"before": args.before_python} if args.before_python else {}
    contenders["agentmesh"] = sys.executable
    load = os.getloadavg()[0]
    children = {name: _contender(python, args.turns, args.sessions) for name, python in contenders.items()}
    results = alternate(children, args.rounds, MEASURED_TO)
    last = max(r["messages"] for rounds in results.values() for r in rounds)
    print(f"one turn's memory calls (PutSession, StartTurn, 3 AppendMessages; local tracing), {args.turns} turns "
          f"one after the other over {args.sessions} sessions (transcripts up to ~{last} messages), median of "
          f"{args.rounds} alternating rounds; load average {load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end\n")
    print("| contender | service CPU / turn | PutSession p50 | StartTurn p50 | AppendMessages p50 |")
    print("| --- | --- | --- | --- | --- |")
    for name, rounds in results.items():
        cells = [statistics.median(r[key] for r in rounds)
                 for key in ("service_ms", "PutSession_ms", "StartTurn_ms", "AppendMessages_ms")]
        print(f"| {name} | " + " | ".join(f"{c:.3f} ms" for c in cells) + " |")


if __name__ == "__main__":
    main()
