"""What a round trip to another process costs when that process has been idle.

A turn hands work from process to process: client → gateway → agent → memory → agent → tools →
… Between two hops a service often sits idle for milliseconds (while the model answers or the
jail runs), and a round trip to a process that has been idle is slower than one to a process
that is busy — its threads and the vCPU under them must first wake. This bench measures by how
much, on three round trips from one asyncio process to another, each preceded by an idle gap
of 0, 1, 3 and 10 ms:

- **TCP echo**: a line each way over a plain asyncio TCP connection — the machine's own floor,
  an event loop on each side and nothing else;
- **gRPC stream echo**: a message each way on an open grpc.aio bidirectional stream (a generic
  bytes handler, nothing of agentmesh) — what grpc.aio adds;
- **carried append**: the agent's transcript append (`MemoryClient.append_messages`, carried on
  `Memory.CarriedCalls`) against a real `agentmesh serve memory` with local tracing — a call
  of a turn as it is made.

    python -m benches.idle_hops [--calls 300] [--rounds 3]

The contenders run in alternation, gap by gap, so that the load of a shared machine falls on
all of them alike; each cell is the median over `--rounds` rounds of each round's p50. With no
gap, the CPU each round trip costs the caller (this process) and the callee (its process, from
`/proc`) is reported too: what one message each way costs a turn's CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import tempfile
import time
from typing import Awaitable, Callable

from benches._contenders import cpu_s, free_address, service

GAPS_MS = (0, 1, 3, 10)
ECHO_METHOD = "/bench.Echo/Stream"


# --- the echo process ----------------------------------------------------------------------------

async def _echo_servers(tcp_port, grpc_port) -> None:
    import grpc

    async def echo_line(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            writer.write(line)
            await writer.drain()
        writer.close()

    async def echo_stream(requests, context):
        async for request in requests:
            yield request

    tcp = await asyncio.start_server(echo_line, "127.0.0.1", 0)
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "bench.Echo", {"Stream": grpc.stream_stream_rpc_method_handler(echo_stream)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    tcp_port.put(tcp.sockets[0].getsockname()[1])
    grpc_port.put(port)
    await server.wait_for_termination()


def _serve_echo(tcp_port, grpc_port) -> None:
    asyncio.run(_echo_servers(tcp_port, grpc_port))


# --- the contenders ------------------------------------------------------------------------------

async def tcp_echo(port: int) -> tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def once() -> None:
        writer.write(b"x\n")
        await reader.readline()

    async def close() -> None:
        writer.close()

    return once, close


async def grpc_echo(port: int) -> tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]]:
    import grpc

    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    call = channel.stream_stream(ECHO_METHOD)()
    replies = call.__aiter__()

    async def once() -> None:
        await call.write(b"x")
        await replies.__anext__()

    async def close() -> None:
        call.cancel()
        await channel.close()

    return once, close


async def carried_append(address: str, home: str) -> tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]]:
    from agentmesh.clients.memory import MemoryClient
    from agentmesh.config import Settings
    from agentmesh.rpc.client import open_channel
    from agentmesh.rpc.identity import ServiceIdentity
    from agentmesh.telemetry import setup_telemetry
    from agentmesh.v1 import common_pb2

    settings = Settings.from_env({"AGENTMESH_HOME": home, "AGENTMESH_TRACES": "local"})
    identity = ServiceIdentity.open("agent", settings.keys_dir)
    telemetry = setup_telemetry("agent", settings)
    channel = open_channel(address, telemetry, identity=identity, audience="memory")
    await asyncio.wait_for(channel.channel_ready(), 60)
    client = MemoryClient(channel, carry=(identity, telemetry.tracer_provider.get_tracer("agentmesh.rpc")))
    step = [common_pb2.Message(role="tool", content="ok", tool_call_id="call-1", name="shell")]
    await client.put_session("bench")

    async def once() -> None:
        await client.append_messages("bench", step)

    async def close() -> None:
        await client.close()
        await channel.close()
        telemetry.shutdown()

    return once, close


async def measure(once: Callable[[], Awaitable[None]], calls: int, gap_ms: float, callee: int) -> dict[str, float]:
    """p50 latency (ms), and the caller's and the callee's CPU per round trip (ms)."""
    latencies = []
    caller0, callee0 = time.process_time(), cpu_s(callee)
    for _ in range(calls):
        if gap_ms:
            await asyncio.sleep(gap_ms / 1000)
        started = time.perf_counter()
        await once()
        latencies.append(time.perf_counter() - started)
    return {"p50": statistics.median(latencies) * 1000,
            "caller_cpu": (time.process_time() - caller0) / calls * 1000,
            "callee_cpu": (cpu_s(callee) - callee0) / calls * 1000}


async def main_async(args) -> None:
    ctx = multiprocessing.get_context("spawn")
    tcp_port, grpc_port = ctx.Queue(), ctx.Queue()
    echo = ctx.Process(target=_serve_echo, args=(tcp_port, grpc_port), daemon=True)
    echo.start()
    home = tempfile.mkdtemp(prefix="agentmesh-idle-hops-")
    address = free_address()
    env = {**os.environ, "AGENTMESH_HOME": home, "AGENTMESH_MEMORY_ADDR": address, "AGENTMESH_TRACES": "local",
           "AGENTMESH_LOG_LEVEL": "warning"}
    load_before = os.getloadavg()[0]
    with service("memory", env) as memory:
        contenders = {
            "TCP echo (asyncio, both sides)": (await tcp_echo(tcp_port.get(timeout=60)), echo.pid),
            "gRPC stream echo (grpc.aio, both sides)": (await grpc_echo(grpc_port.get(timeout=60)), echo.pid),
            "carried append (agent → memory service)": (await carried_append(address, home), memory.pid),
        }
        try:
            names = list(contenders)
            for (once, _), callee in contenders.values():
                await measure(once, 200, 0, callee)  # warm: connections, caches, the checked token
            cells: dict[str, dict[int, list[dict[str, float]]]] = {name: {gap: [] for gap in GAPS_MS} for name in names}
            for r in range(args.rounds):
                for gap in GAPS_MS:
                    for name in names[r % len(names):] + names[: r % len(names)]:
                        (once, _), callee = contenders[name]
                        cells[name][gap].append(await measure(once, args.calls, gap, callee))
        finally:
            for (_, close), _callee in contenders.values():
                await close()
            echo.terminate()

    def median(name: str, gap: int, key: str) -> float:
        return statistics.median(cell[key] for cell in cells[name][gap])

    print(f"round trip p50 (ms) after an idle gap; {args.calls} calls per cell, median of {args.rounds} alternating rounds;"
          " CPU per round trip with no gap")
    print()
    print("| round trip | " + " | ".join(f"{gap} ms idle" for gap in GAPS_MS)
          + " | 10 ms idle − none | CPU: caller | CPU: callee |")
    print("| --- |" + " --- |" * (len(GAPS_MS) + 3))
    for name in names:
        p50s = [median(name, gap, "p50") for gap in GAPS_MS]
        print(f"| {name} | " + " | ".join(f"{m:.3f}" for m in p50s) + f" | +{p50s[-1] - p50s[0]:.3f} | "
              f"{median(name, 0, 'caller_cpu'):.3f} | {median(name, 0, 'callee_cpu'):.3f} |")
    print(f"\nload average {load_before:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
