"""Tracing overhead: chat-turn latency with AGENTMESH_TRACES=none versus =local, same run.

Two complete stacks (five real gRPC services each, the test stack from tests/support) run side
by side in one process, one with tracing off and one with the local span store, each with its
own scripted OpenAI-compatible model server. Turns alternate between the two, so both see the
same machine state; each turn uses a fresh session so history does not grow.

Wall-clock latency on a shared 2-core machine is noisy, so CPU time per turn is reported too.

Scenarios: "tool" — the model asks for one shell call, then answers (two model calls, one
sandbox); "text" — one model call, no tool.

    .venv/bin/python -m benches.tracing [--turns 40] [--warmup 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from agentmesh.logs import configure_logging
from agentmesh.v1 import gateway_pb2
from tests.support.llm_server import ScriptedLLMServer, reply, tool_call
from tests.support.stack import Stack

MODES = ("none", "local")


def tool_turn(request):
    """Ask for one shell call after the user's message; answer once the result is back."""
    last = request.messages[-1] if request.messages else {}
    if last.get("role") == "tool":
        return reply("done")
    return reply("", tool_call("shell", {"command": "echo bench"}))


def text_turn(_request):
    return reply("hello from the model")


async def one_turn(stack: Stack, session_id: str) -> float:
    request = gateway_pb2.ChatRequest(session_id=session_id, message="go")
    started = time.perf_counter()
    kinds = [e.WhichOneof("payload") async for e in stack.gateway_stub().Chat(request, timeout=60)]
    elapsed = time.perf_counter() - started
    if kinds[-1] != "run_finished":
        raise RuntimeError(f"turn did not finish: {kinds}")
    return elapsed


async def measure(scenario, turns: int, warmup: int, root: Path, block: int = 5) -> dict[str, dict[str, list[float]]]:
    """Wall-clock seconds per turn, and CPU seconds per turn of the whole process (all services,
    the model server and the client; exporters flushed at the end of each block so their work
    is counted in the mode that caused it)."""
    servers = {mode: ScriptedLLMServer(default=scenario) for mode in MODES}
    stacks: dict[str, Stack] = {}
    samples: dict[str, dict[str, list[float]]] = {mode: {"wall": [], "cpu": []} for mode in MODES}
    try:
        for mode in MODES:
            server = servers[mode].__enter__()
            home = root / f"{scenario.__name__}-{mode}"
            stacks[mode] = await Stack(home, llm_base_url=server.base_url, env={"AGENTMESH_TRACES": mode}).start()
        for mode in MODES:
            for i in range(warmup):
                await one_turn(stacks[mode], f"warmup-{mode}-{i}")
        rounds = max(1, -(-turns // block))
        for r in range(rounds):
            # Blocks alternate, and so does which mode goes first in a round.
            for mode in (MODES if r % 2 == 0 else MODES[::-1]):
                cpu = time.process_time()
                for i in range(block):
                    samples[mode]["wall"].append(await one_turn(stacks[mode], f"bench-{mode}-{r}-{i}"))
                for host in stacks[mode].hosts.values():
                    await asyncio.to_thread(host.telemetry.force_flush)
                samples[mode]["cpu"].append((time.process_time() - cpu) / block)
    finally:
        for stack in stacks.values():
            await stack.stop()
        for server in servers.values():
            server.__exit__(None, None, None)
    return samples


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        mem_kb = next(int(l.split()[1]) for l in Path("/proc/meminfo").read_text().splitlines() if l.startswith("MemTotal"))
        memory = f"{mem_kb / 1024 / 1024:.0f} GiB"
    except (OSError, StopIteration, ValueError):
        memory = "?"
    return f"{model}, {os.cpu_count()} cores, {memory}, Python {platform.python_version()}"


async def main_async(turns: int, warmup: int) -> None:
    with tempfile.TemporaryDirectory(prefix="agentmesh-bench-tracing-") as tmp, open(os.devnull, "w") as sink:
        # Services log as they do in production (JSON at info), into the void.
        configure_logging("bench", "info", stream=sink)
        print(f"machine: {machine()}")
        print(f"turns per mode and scenario: {turns} (after {warmup} warm-up), alternating modes\n")
        header = (f"{'scenario':<9} {'traces':<7} {'median ms':>10} {'p90 ms':>8} {'mean ms':>8} "
                  f"{'overhead (median)':>20} {'CPU ms/turn':>12} {'CPU overhead':>13}")
        print(header)
        print("-" * len(header))
        for scenario in (tool_turn, text_turn):
            samples = await measure(scenario, turns, warmup, Path(tmp))
            base = statistics.median(samples["none"]["wall"])
            base_cpu = statistics.median(samples["none"]["cpu"])
            for mode in MODES:
                wall, cpu = samples[mode]["wall"], statistics.median(samples[mode]["cpu"])
                median = statistics.median(wall)
                if mode == "none":
                    overhead = cpu_overhead = "baseline"
                else:
                    overhead = f"{(median - base) * 1000:+.1f} ms ({(median / base - 1) * 100:+.1f} %)"
                    cpu_overhead = f"{(cpu / base_cpu - 1) * 100:+.1f} %"
                print(f"{scenario.__name__.removesuffix('_turn'):<9} {mode:<7} {median * 1000:>10.1f} "
                      f"{percentile(wall, 0.9) * 1000:>8.1f} {statistics.fmean(wall) * 1000:>8.1f} {overhead:>20} "
                      f"{cpu * 1000:>12.1f} {cpu_overhead:>13}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=40, help="turns per mode and scenario (in blocks of 5)")
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main_async(args.turns, args.warmup))


if __name__ == "__main__":
    main()
