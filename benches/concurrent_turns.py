"""Many turns at once through the five services: does anything inside agentmesh queue them?

N turns (default 1,000) are started together through `Gateway.Chat` against the real stack
(`agentmesh serve` processes, as `agentmesh up` runs them) and a model server on loopback that
takes `--model-s` (default 2 s) to answer each call. A turn is one model call (text), or with
`--tools` two calls and a jailed `true` between them. What a turn took beyond the model's own
time is what agentmesh added — waiting for a connection, a slot, a thread, a stream:

    added = turn latency - model calls x model_s

While the turns are open, /proc is sampled for the gateway's, agent's and memory's resident
memory and open file descriptors; the report gives their growth over the idle stack per 100
open turns (taken at the sample with the most turns open).

    python -m benches.concurrent_turns [--turns 1000] [--model-s 2] [--tools] [--channels 8]
                                       [--deadline-s 300] [--before-python ../main/.venv/bin/python]

Bounded: every turn has a deadline (`--deadline-s`), the model server and the stack are
stopped at the end, and the run stops by itself. `--before-python` runs the same load on a
second stack under another checkout's interpreter afterwards (not at once: on a 2-core machine
two loads at once would measure each other).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc

from agentmesh.v1 import gateway_pb2, gateway_pb2_grpc
from benches.turn_overhead import cpu_s, percentile, start_stack
from tests.support.llm_server import reply, tool_call
from tests.support.llm_wire import openai_events

WATCHED = ("gateway", "agent", "memory")
CPU_WATCHED = ("gateway", "agent", "memory", "tools")


# --- the model server: asyncio, so a thousand connections cost no thread each -----------------

ARRIVALS: list[float] = []  # in the model server's process: when each call arrived


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, model_s: float) -> None:
    """HTTP/1.1 keep-alive: each POST waits `model_s`, then streams an OpenAI completion (a tool
    call first when the request has none answered yet and the turn asked for tools)."""
    import json

    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.strip())
            body = json.loads(await reader.readexactly(length)) if length else {}
            ARRIVALS.append(time.time())
            await asyncio.sleep(model_s)
            messages = body.get("messages") or [{}]
            wants_tool = "use a tool" in str(messages[-1].get("content", "")) and messages[-1].get("role") == "user"
            step = reply("", tool_call("shell", {"command": "true"})) if wants_tool else reply("done", chunk_chars=64)
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            events = openai_events(step, body.get("model") or "bench", include_usage)
            out = [b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"]
            out += [b"%x\r\n%s\r\n" % (len(e), e) for e in events]
            out.append(b"0\r\n\r\n")
            writer.write(b"".join(out))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, ValueError):
        pass
    finally:
        writer.close()


def _serve_model(port_out, stop, model_s: float, asked, arrivals_out) -> None:
    """`asked` set: the arrival times so far go to `arrivals_out` (and are forgotten)."""
    async def main() -> None:
        server = await asyncio.start_server(lambda r, w: _answer(r, w, model_s), "127.0.0.1", 0, backlog=4096)
        port_out.put(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1")
        while not stop.is_set():
            await asyncio.sleep(0.05)
            if asked.is_set():
                asked.clear()
                arrivals_out.put(list(ARRIVALS))
                ARRIVALS.clear()
        server.close()

    _raise_nofile()
    asyncio.run(main())


def _raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# --- /proc ----------------------------------------------------------------------------------

def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def runqueue_s(pid: int) -> float:
    """Seconds the process's threads were runnable but waited for a CPU (schedstat's second
    field): on a shared machine, the part of a delay that is other people's load, not ours."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            pass
    return total / 1e9


def snapshot(pids: dict[str, int]) -> dict[str, tuple[float, int]]:
    return {name: (rss_mb(pid), open_fds(pid)) for name, pid in pids.items()}


# --- the load -------------------------------------------------------------------------------

class Load:
    def __init__(self, stubs: list, turns: int, deadline_s: float, tools: bool):
        self.started_at = time.time()
        self.stubs, self.turns, self.deadline_s, self.tools = stubs, turns, deadline_s, tools
        self.open = 0
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self.waited = 0  # turns whose stream said they waited for a model slot

    async def turn(self, n: int, tag: str) -> None:
        stub = self.stubs[n % len(self.stubs)]
        message = "use a tool please" if self.tools else "hello"
        started = time.perf_counter()
        self.open += 1
        try:
            last = None
            async for event in stub.Chat(gateway_pb2.ChatRequest(session_id=f"{tag}-{n}", message=message),
                                         timeout=self.deadline_s):
                last = event
                if event.WhichOneof("payload") == "status" and "model slot" in event.status.message:
                    self.waited += 1
            if last is None or last.WhichOneof("payload") != "run_finished":
                self.errors.append(f"ended with {last.WhichOneof('payload') if last else 'nothing'}: "
                                   f"{last.error.message if last is not None and last.HasField('error') else ''}")
            else:
                self.latencies.append(time.perf_counter() - started)
        except grpc.aio.AioRpcError as exc:
            self.errors.append(f"{exc.code().name}: {exc.details()}")
        finally:
            self.open -= 1

    async def run(self, tag: str, pids: dict[str, int]) -> dict:
        idle = snapshot(pids)
        cpu_before = {name: (cpu_s(pid), runqueue_s(pid)) for name, pid in pids.items()}
        self.started_at = time.time()
        peak_open, at_peak = 0, idle
        tasks = [asyncio.create_task(self.turn(n, tag)) for n in range(self.turns)]
        sampling = asyncio.gather(*tasks)
        while not sampling.done():
            await asyncio.sleep(0.25)
            if self.open >= peak_open and self.open:
                # Growth is read where the most turns are open (all of them, if the stack keeps up).
                peak_open, at_peak = self.open, snapshot(pids)
        await sampling
        cpu = {name: (cpu_s(pid) - cpu_before[name][0], runqueue_s(pid) - cpu_before[name][1])
               for name, pid in pids.items()}
        return {"idle": idle, "peak_open": peak_open, "at_peak": at_peak, "cpu_s": cpu}


async def measure(stack, turns: int, channels: int, deadline_s: float, tools: bool, label: str,
                  arrivals) -> dict:
    await stack.wait_healthy()
    # Several client connections, as many users would come on several (one HTTP/2 connection
    # would also measure its own flow control); a local subchannel pool keeps them apart.
    address = stack.settings.address_of("gateway")
    chans = [grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
             for _ in range(channels)]
    stubs = [gateway_pb2_grpc.GatewayStub(c) for c in chans]
    pids = {name: stack.children[name].pid for name in CPU_WATCHED}
    try:
        warm = Load(stubs, min(20, turns), deadline_s, tools)
        await warm.run(f"{label}-warm", pids)  # connections, imports, the first jail
        await arrivals()  # forget the warm-up's calls
        load = Load(stubs, turns, deadline_s, tools)
        started = time.perf_counter()
        samples = await load.run(label, pids)
        wall = time.perf_counter() - started
    finally:
        for c in chans:
            await c.close()
    return {"load": load, "wall": wall, "arrivals": await arrivals(), **samples}


def report(label: str, result: dict, model_s: float, calls_per_turn: int) -> None:
    load: Load = result["load"]
    added = [lat - calls_per_turn * model_s for lat in load.latencies]
    print(f"\n{label}: {load.turns} turns at once, {len(load.latencies)} finished, {len(load.errors)} errors, "
          f"{load.waited} said they waited for a model slot; wall {result['wall']:.1f}s")
    if added:
        print(f"  added latency over {calls_per_turn} x {model_s:g}s: p50 {statistics.median(added) * 1000:.0f} ms, "
              f"p90 {percentile(added, 0.9) * 1000:.0f} ms, p99 {percentile(added, 0.99) * 1000:.0f} ms, "
              f"max {max(added) * 1000:.0f} ms")
    arrived = sorted(t - load.started_at for t in result["arrivals"])
    if arrived:
        print(f"  model calls arrived at the model {arrived[0]:.2f}s to {arrived[-1]:.2f}s after the turns started "
              f"(median {statistics.median(arrived):.2f}s)")
    print("  over the load, CPU seconds used / waited for a CPU: "
          + ", ".join(f"{n} {used:.1f} / {waited:.1f}" for n, (used, waited) in result["cpu_s"].items()))
    for error in sorted(set(load.errors))[:5]:
        print(f"  error x{load.errors.count(error)}: {error[:300]}")
    open_turns = result["peak_open"]
    print(f"  at most {open_turns} turns open at a sample; per 100 open turns over the idle stack:")
    print("  | service | idle RSS MB | RSS MB / 100 turns | idle fds | fds / 100 turns |")
    print("  | --- | ---: | ---: | ---: | ---: |")
    for name in WATCHED:
        (rss0, fd0), (rss1, fd1) = result["idle"][name], result["at_peak"][name]
        per = 100 / open_turns if open_turns else float("nan")
        print(f"  | {name} | {rss0:.1f} | {(rss1 - rss0) * per:.2f} | {fd0} | {(fd1 - fd0) * per:.1f} |")


async def main_async(args) -> None:
    ctx = multiprocessing.get_context("spawn")
    port_out, stop, asked, arrivals_out = ctx.Queue(), ctx.Event(), ctx.Event(), ctx.Queue()
    model = ctx.Process(target=_serve_model, args=(port_out, stop, args.model_s, asked, arrivals_out), daemon=True)

    async def arrivals() -> list[float]:
        asked.set()
        return await asyncio.to_thread(arrivals_out.get, True, 30)

    model.start()
    base_url = port_out.get(timeout=120)  # a loaded machine starts a process slowly
    home = Path(tempfile.mkdtemp(prefix="agentmesh-concurrent-"))
    os.chmod(home, 0o755)
    pythons = {"agentmesh": sys.executable}
    if args.before_python:
        pythons = {"before": args.before_python, **pythons}
    load_before = os.getloadavg()[0]
    results = {}
    try:
        for label, python in pythons.items():
            stack = start_stack(base_url, home / label, python)
            try:
                results[label] = await asyncio.wait_for(
                    measure(stack, args.turns, args.channels, args.deadline_s, args.tools, label, arrivals),
                    args.deadline_s * 2 + 120)
            finally:
                await asyncio.to_thread(stack.stop)
    finally:
        stop.set()
        model.join(5)
    calls = 2 if args.tools else 1
    print(f"{args.turns} concurrent {'tool' if args.tools else 'text'} turns; model answers each call after "
          f"{args.model_s:g}s; {args.channels} client connections; soft RLIMIT_NOFILE of the bench "
          f"{resource.getrlimit(resource.RLIMIT_NOFILE)[0]}")
    for label, result in results.items():
        report(label, result, args.model_s, calls)
    print(f"\nload average {load_before:.2f} at the start, {os.getloadavg()[0]:.2f} at the end; {os.cpu_count()} CPUs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--model-s", type=float, default=2.0, help="seconds the model takes per call")
    parser.add_argument("--tools", action="store_true", help="two model calls and a jailed `true` per turn")
    parser.add_argument("--channels", type=int, default=8, help="client connections to the gateway")
    parser.add_argument("--deadline-s", type=float, default=120.0, help="each turn's deadline")
    parser.add_argument("--before-python", default="", help="also run the load on this interpreter's checkout")
    args = parser.parse_args()
    _raise_nofile()  # the bench's own client holds a stream per turn
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
