"""What one internal call costs in CPU, on the caller's side and on the service's.

A real memory service (`agentmesh serve memory`, its own process, local tracing on) answers
`GetNamespaceSettings` — a call whose own work is a few tens of µs — to a client signed as the
gateway, on a channel from `open_channel` (signing, waiting for the peer, the client span), as
the services call each other. CPU is read from `/proc` for the service and from the client's
own process time; the median of `--rounds` rounds of `--calls` calls one after the other.

    python -m benches.rpc_call [--calls 3000] [--rounds 3] [--before-python ../main/.venv/bin/python]

Each contender runs in a child process with its interpreter (so a checkout's client code and
service code are measured together); the rounds alternate between contenders so that the load
of a shared machine falls on all of them alike. `plain channel` is the caller's floor: this
checkout's service called on a plain grpc.aio channel, the token added by hand, nothing traced
on the client.

`--appends` measures the agent's transcript append instead — one step's message, signed as
the agent, through `MemoryClient.append_messages` — as a unary call against the same call
carried on the appends' long-lived stream (`Memory.AppendStream`, agentmesh.rpc.carried),
each against a memory service of its own:

    python -m benches.rpc_call --appends [--calls 3000] [--rounds 3]

`--start-turns` does the same for the agent's StartTurn (a turn's first message after a
20-message page of its session's transcript, on `Memory.CarriedCalls`), `--executes` for its
tool call (`read_file` of a missing file — the tools service's own work without a sandbox —
through the agent's GrpcToolRunner, on `Tools.CarriedCalls`), each against a service of its own:

    python -m benches.rpc_call --start-turns [--calls 1000] [--rounds 3]
    python -m benches.rpc_call --executes [--calls 3000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time

if __package__:  # python -m benches.rpc_call
    from benches._contenders import alternate, cpu_s, free_address, serve_rounds, service, start
else:  # a contender: this file run by path under another checkout's interpreter (benches/_contenders.py)
    from _contenders import alternate, cpu_s, free_address, serve_rounds, service, start

MEASURED_TO = "rpc_call_result:"


async def _child(calls: int, bare: bool, mode: str = "settings") -> None:
    """Serve and call; then, for each line read on stdin, one round; print its result."""
    import grpc

    from agentmesh.agent.adapters.tools import GrpcToolRunner
    from agentmesh.agent.types import ToolCall
    from agentmesh.clients.memory import MemoryClient
    from agentmesh.clients.tools import ToolsClient
    from agentmesh.config import Settings
    from agentmesh.internal.v1 import memory_service_pb2, memory_service_pb2_grpc
    from agentmesh.rpc.client import open_channel
    from agentmesh.rpc.identity import ServiceIdentity
    from agentmesh.telemetry import setup_telemetry
    from agentmesh.v1 import common_pb2, sessions_pb2

    home = tempfile.mkdtemp(prefix="agentmesh-rpc-call-")
    address = free_address()
    env = {**os.environ, "AGENTMESH_HOME": home, "AGENTMESH_MEMORY_ADDR": address, "AGENTMESH_TRACES": "local",
           "AGENTMESH_LOG_LEVEL": "warning"}
    served = "tools" if mode.startswith("execute") else "memory"
    env["AGENTMESH_TOOLS_ADDR"] = address
    with service(served, env) as server:
        settings = Settings.from_env({"AGENTMESH_HOME": home, "AGENTMESH_TRACES": "local"})
        caller = "gateway" if mode == "settings" else "agent"
        identity = ServiceIdentity.open(caller, settings.keys_dir)
        telemetry = setup_telemetry(caller, settings)
        metadata = None
        if bare:
            channel = grpc.aio.insecure_channel(address)
            metadata = (("x-agentmesh-service-token", identity.token("memory")),)
        else:
            channel = open_channel(address, telemetry, identity=identity, audience=served)
        await asyncio.wait_for(channel.channel_ready(), 60)
        stub = memory_service_pb2_grpc.MemoryStub(channel)
        request = sessions_pb2.GetNamespaceSettingsRequest(namespace="default")
        tracer = telemetry.tracer_provider.get_tracer("agentmesh.rpc")
        # The agent's calls, as unary calls or carried on its streams (agentmesh.rpc.carried).
        carried = mode.endswith("-carried")
        client = MemoryClient(channel, carry=(identity, tracer) if carried else None)
        step = [common_pb2.Message(role="tool", content="ok", tool_call_id="call-1", name="shell")]
        turn = memory_service_pb2.StartTurnRequest(session_id="bench", messages=[common_pb2.Message(role="user", content="hi")],
                                           page_size=20)
        runner = GrpcToolRunner(ToolsClient(channel, address, carry=(identity, tracer) if carried else None), timeout_s=30)
        tool_call = ToolCall("call-1", "read_file", json.dumps({"path": "missing.txt"}))
        if mode.startswith(("append", "start-turn")):
            await client.put_session("bench")
            await client.append_messages("bench", step * 20)

        async def one() -> None:
            if mode == "settings":
                await stub.GetNamespaceSettings(request, metadata=metadata, timeout=30)
            elif mode.startswith("append"):
                await client.append_messages("bench", step)
            elif mode.startswith("start-turn"):
                await client.start_turn(turn, 30)
            else:
                await runner.execute("bench", tool_call)

        async def measure() -> dict[str, float]:
            latencies = []
            client0, service0 = time.process_time(), cpu_s(server.pid)
            for _ in range(calls):
                started = time.perf_counter()
                await one()
                latencies.append(time.perf_counter() - started)
            client1, service1 = time.process_time(), cpu_s(server.pid)
            return {
                "p50_ms": statistics.median(latencies) * 1000,
                "client_ms": (client1 - client0) / calls * 1000,
                "service_ms": (service1 - service0) / calls * 1000,
            }

        for _ in range(300):  # warm: connections, caches, the checked token
            await one()
        await serve_rounds(MEASURED_TO, measure)
        await client.close()
        await runner.close()
        await channel.close()
        telemetry.shutdown()


def _contender(python: str, calls: int, bare: bool, mode: str = "settings"):
    return start(python, __file__, ["--child", "--calls", str(calls), "--mode", mode] + (["--bare"] if bare else []))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before-python", default="", help="also measure another checkout's interpreter (and code)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--appends", action="store_true",
                        help="measure the agent's transcript append instead: a unary call against one carried on the "
                             "appends' stream (agentmesh.rpc.carried)")
    parser.add_argument("--start-turns", action="store_true",
                        help="measure the agent's StartTurn instead: unary against carried on its stream to memory")
    parser.add_argument("--executes", action="store_true",
                        help="measure the agent's tool call instead: unary against carried on its stream to tools")
    parser.add_argument("--mode", default="settings", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        asyncio.run(_child(args.calls, args.bare, args.mode))
        return

    contenders: dict[str, tuple[str, bool, str]] = {}
    agent_call = next(((method, mode) for flag, method, mode in (
        (args.appends, "AppendMessages", "append"), (args.start_turns, "StartTurn", "start-turn"),
        (args.executes, "Execute", "execute")) if flag), None)
    if agent_call is not None:
        method, mode = agent_call
        contenders[f"{method}, unary call"] = (sys.executable, False, f"{mode}-unary")
        contenders[f"{method}, carried on the stream"] = (sys.executable, False, f"{mode}-carried")
    else:
        contenders["plain channel"] = (sys.executable, True, "settings")
        if args.before_python:
            contenders["before"] = (args.before_python, False, "settings")
        contenders["agentmesh"] = (sys.executable, False, "settings")
    load = os.getloadavg()[0]
    children = {name: _contender(python, args.calls, bare, mode) for name, (python, bare, mode) in contenders.items()}
    results = alternate(children, args.rounds, MEASURED_TO)
    what = {
        "append": "one append of a step (memory AppendMessages, signed as the agent",
        "start-turn": "one turn's start (memory StartTurn after a 20-message page, signed as the agent",
        "execute": "one tool call (tools Execute of read_file, no sandbox, signed as the agent",
    }[agent_call[1]] if agent_call is not None else "one unary call (memory GetNamespaceSettings"
    print(f"{what}, local tracing), {args.calls} calls one after the other, "
          f"median of {args.rounds} alternating rounds; load average {load:.2f} at the start, "
          f"{os.getloadavg()[0]:.2f} at the end\n")
    print("| contender | p50 latency | client CPU / call | service CPU / call | both |")
    print("| --- | --- | --- | --- | --- |")
    for name, rounds in results.items():
        p50, client, service = (statistics.median(r[key] for r in rounds) for key in ("p50_ms", "client_ms", "service_ms"))
        print(f"| {name} | {p50:.3f} ms | {client:.3f} ms | {service:.3f} ms | {client + service:.3f} ms |")


if __name__ == "__main__":
    main()
