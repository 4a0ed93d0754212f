"""Platform overhead of one tool-using turn, beside a single-process baseline measured in the same run.

A turn is two model calls (the first asks for `shell: true`, the second answers) and one
sandboxed process. The model server answers instantly, so what is measured is agentmesh:

- **platform**: `Gateway.Chat` through every hop — gateway → agent → memory (session,
  transcript, recall) → model → tools → bubblewrap jail → model → memory — with the five
  services running as separate `agentmesh serve` processes, as `agentmesh up` runs them.
- **baseline**: the same two model calls (the agent's own OpenAI provider) and the same
  jailed process (the tools service's own executor) made directly from one Python process,
  as a single-process agent server would. "The same calls" means the same request: the
  platform's first model request is recorded by the model server, and the baseline sends its
  system prompt and its tool catalog (15 tools, ~9.8 KB) too — an agent server with the same
  tools sends them on every call. `--minimal-baseline` adds the bench's earlier baseline beside
  it (one tool, no system prompt, ~0.3 KB), for comparison with numbers taken before.

The CPU each service uses per turn is read from `/proc` over the sequential turns (the
scheduler, which a turn does not reach, left out). The memory service's resident memory is sampled after each of `--rss-rounds` further rounds of
the 32-session load (the first round warms it): flat means it does not grow with the turns it
has served.

    python -m benches.turn_overhead [--turns 100] [--sessions 32] [--turns-per-session 4] [--rss-rounds 4]
                                    [--before-python ../main/.venv/bin/python] [--minimal-baseline]

`--before-python` also runs the five services with another checkout's interpreter (and so its
code), in the same run, for a before/after comparison. All contenders run at once and are
measured in alternation — turn by turn for latency, round by round for the concurrent load —
so that the load of a shared machine, which changes by the minute, falls on all of them alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Awaitable, Callable

from agentmesh.agent.providers import build_provider
from agentmesh.agent.settings import AgentSettings
from agentmesh.agent.types import ChatMessage, ModelReply, ModelRequest, ToolSpec
from agentmesh.cli.stack import LocalStack, free_address
from agentmesh.config import SERVICES, LLMSettings, Settings
from agentmesh.logs import configure_logging
from agentmesh.memory.recall import COALESCE_S
from agentmesh.rpc.client import open_channel
from agentmesh.telemetry import setup_telemetry
from agentmesh.tools.sandbox.local import jail_host_identity
from agentmesh.tools.server import build_core, make_executor
from agentmesh.tools.settings import ToolsSettings
from agentmesh.tools.workspace import Workspaces
from agentmesh.v1 import gateway_pb2, gateway_pb2_grpc
from tests.support.llm_server import ScriptedLLMServer, reply, tool_call

SHELL_SPEC = ToolSpec("shell", "run a command", {"type": "object", "properties": {"command": {"type": "string"}}})


def respond(request):
    """Ask for `shell: true` first; answer once the tool result is back."""
    if request.body["messages"][-1]["role"] == "tool":
        return reply("done", chunk_chars=64)
    return reply("", tool_call("shell", {"command": "true"}), chunk_chars=64)


def _serve_llm(port_out, stop, record_to: str = "") -> None:
    """The model server; with `record_to`, the first request that has a system prompt (the
    platform's) is written there as JSON, for the baseline to send the same."""
    recorded = False

    def recording(request):
        nonlocal recorded
        if not recorded and request.body["messages"][0]["role"] == "system":
            recorded = True
            partial = Path(record_to + ".partial")
            partial.write_text(json.dumps(request.body))
            partial.rename(record_to)
        return respond(request)

    with ScriptedLLMServer(default=recording if record_to else respond) as llm:
        port_out.put(llm.base_url)
        stop.wait()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


# --- platform -------------------------------------------------------------------------------


async def platform_turn(stub, session_id: str) -> float:
    started = time.perf_counter()
    kinds, last = [], None
    async for event in stub.Chat(gateway_pb2.ChatRequest(session_id=session_id, message="run true"), timeout=120):
        kinds.append(event.WhichOneof("payload"))
        last = event
    if kinds[-1] != "run_finished" or "tool_result" not in kinds:
        raise RuntimeError(f"unexpected turn: {kinds} {last}")
    return time.perf_counter() - started


# --- baseline -------------------------------------------------------------------------------


class SingleProcessAgent:
    """What a single-process agent server does for this turn, with agentmesh's own parts: one
    tool and no system prompt until `send_as` gives it the platform's."""

    def __init__(self, home: Path, base_url: str):
        env = {"AGENTMESH_HOME": str(home), "AGENTMESH_LLM_BASE_URL": base_url, "AGENTMESH_LLM_MODEL": "bench",
               "AGENTMESH_TRACES": "none", "AGENTMESH_LLM_PROVIDER": "openai"}
        settings = Settings.from_env(env)
        # As the platform's services log in this bench: JSON lines, warnings and worse.
        configure_logging("baseline", "warning")
        tools_settings = ToolsSettings.from_settings(settings)
        tools_settings.workspace_root.mkdir(parents=True, exist_ok=True)
        workspaces = Workspaces(tools_settings.workspace_root, jail_host_identity(tools_settings))
        telemetry = setup_telemetry("baseline", settings)
        self.executor = make_executor(tools_settings, workspaces, telemetry)
        self.tools = build_core(tools_settings, self.executor, workspaces)
        self.provider, self.close_provider = build_provider(LLMSettings.from_env(env), AgentSettings.from_env(env))
        self.prompt: list[ChatMessage] = []
        self.specs = [SHELL_SPEC]

    def send_as(self, request: dict) -> None:
        """Send the system prompt and the tool catalog of this recorded OpenAI request."""
        self.prompt = [ChatMessage(role="system", content=request["messages"][0]["content"])]
        self.specs = [ToolSpec(t["function"]["name"], t["function"]["description"], t["function"]["parameters"])
                      for t in request["tools"]]

    async def _call(self, messages) -> ModelReply:
        final = None
        request = ModelRequest(model="bench", messages=self.prompt + messages, tools=self.specs)
        async for item in self.provider.stream(request):
            if isinstance(item, ModelReply):
                final = item
        return final

    async def turn(self, session_id: str) -> float:
        started = time.perf_counter()
        messages = [ChatMessage(role="user", content="run true")]
        first = await self._call(messages)
        call = first.tool_calls[0]
        outcome = await self.tools.execute(session_id, call.call_id, call.name, call.arguments_json)
        if outcome.is_error:
            raise RuntimeError(outcome.output)
        messages += [
            ChatMessage(role="assistant", tool_calls=first.tool_calls),
            ChatMessage(role="tool", content=outcome.output, tool_call_id=call.call_id, name=call.name),
        ]
        await self._call(messages)
        return time.perf_counter() - started

    async def close(self) -> None:
        await self.close_provider()
        await self.executor.close()


# --- driver ---------------------------------------------------------------------------------


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def rss_rounds(stub, memory_pid: int, rounds: int, sessions: int, per_session: int) -> list[float]:
    """Memory-service RSS after each round of the concurrent load (new sessions every round)."""
    samples = []
    for r in range(rounds):
        async def worker(n: int, r: int = r) -> None:
            for _ in range(per_session):
                await platform_turn(stub, f"rss-{r}-{n}")

        await asyncio.gather(*(worker(n) for n in range(sessions)))
        samples.append(rss_mb(memory_pid))
    return samples


def start_stack(base_url: str, home: Path, python: str) -> LocalStack:
    env = {**os.environ, "AGENTMESH_HOME": str(home), "AGENTMESH_LLM_PROVIDER": "openai",
           "AGENTMESH_LLM_BASE_URL": base_url, "AGENTMESH_LLM_MODEL": "bench", "AGENTMESH_LOG_LEVEL": "warning"}
    env.update({f"AGENTMESH_{name.upper()}_ADDR": free_address() for name in SERVICES})
    env["AGENTMESH_GATEWAY_HTTP_ADDR"] = free_address()
    stack = LocalStack(env, log_dir=home / "logs", python=python)
    stack.start()
    return stack


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def interleaved(contenders: dict, turns: int, sessions: int, per_session: int, rounds: int,
                      processes: dict[str, dict[str, int]]) -> dict[str, dict]:
    """Every contender measured turn by turn in alternation (the order rotating), and the
    concurrent load round by round in alternation, so that a shared machine's load, which
    changes by the minute, falls on all of them alike. Throughput is the median of `rounds`.
    For the contenders in `processes` (service -> pid), the CPU each service used over the
    sequential turns, per turn (a stack is idle while the others run their turns)."""
    names = list(contenders)
    for name, turn in contenders.items():
        for i in range(3):  # warm-up: connections, imports, first jail
            await turn(f"{name}-warm-{i}")
    # ... and the conversation index's first pass (COALESCE_S after the first append), which
    # creates the namespace's index shard: a cost of the service's first turns, not of each.
    await asyncio.sleep(COALESCE_S + 0.5)
    latencies: dict[str, list[float]] = {n: [] for n in names}
    cpu_before = {name: {service: cpu_s(pid) for service, pid in pids.items()} for name, pids in processes.items()}
    for i in range(turns):
        for name in names[i % len(names):] + names[: i % len(names)]:
            latencies[name].append(await contenders[name](f"{name}-seq-{i % 8}"))
    await asyncio.sleep(0.5)  # the last spans are exported
    cpu_ms = {name: {service: (cpu_s(pid) - cpu_before[name][service]) / turns * 1000 for service, pid in pids.items()}
              for name, pids in processes.items()}
    rates: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            turn = contenders[name]

            async def session_worker(n: int, turn=turn, name=name, r=r) -> None:
                for _ in range(per_session):
                    await turn(f"{name}-conc-{r}-{n}")

            started = time.perf_counter()
            await asyncio.gather(*(session_worker(n) for n in range(sessions)))
            rates[name].append(sessions * per_session / (time.perf_counter() - started))
    return {
        name: {
            "p50_ms": statistics.median(latencies[name]) * 1000,
            "p99_ms": percentile(latencies[name], 0.99) * 1000,
            "turns_per_s": statistics.median(rates[name]),
            "cpu_ms": cpu_ms.get(name, {}),
        }
        for name in names
    }


async def main_async(args) -> None:
    ctx = multiprocessing.get_context("spawn")
    port_out, stop = ctx.Queue(), ctx.Event()
    home = Path(tempfile.mkdtemp(prefix="agentmesh-bench-"))
    os.chmod(home, 0o755)
    recorded = home / "platform-request.json"
    llm_process = ctx.Process(target=_serve_llm, args=(port_out, stop, str(recorded)), daemon=True)
    llm_process.start()
    base_url = port_out.get(timeout=120)  # a spawned interpreter on a loaded machine takes its time
    load_before = os.getloadavg()[0]
    stacks = {"platform": start_stack(base_url, home / "platform", sys.executable)}
    if args.before_python:
        stacks["before"] = start_stack(base_url, home / "before", args.before_python)
    baseline_agent = SingleProcessAgent(home / "baseline", base_url)
    minimal_agent = SingleProcessAgent(home / "minimal", base_url) if args.minimal_baseline else None
    channels = []
    try:
        contenders: dict[str, Callable[[str], Awaitable[float]]] = {}
        for name, stack in stacks.items():
            await stack.wait_healthy()
            channel = open_channel(stack.settings.address_of("gateway"))
            channels.append(channel)
            stub = gateway_pb2_grpc.GatewayStub(channel)
            contenders[name] = lambda s, stub=stub: platform_turn(stub, s)
        await contenders["platform"]("platform-recorded")
        baseline_agent.send_as(json.loads(recorded.read_text()))
        contenders["baseline"] = baseline_agent.turn
        if minimal_agent is not None:
            contenders["minimal"] = minimal_agent.turn
        processes = {name: {service: child.pid for service, child in stack.children.items() if service != "scheduler"}
                     for name, stack in stacks.items()}
        results = await interleaved(contenders, args.turns, args.sessions, args.turns_per_session, args.rounds,
                                    processes)
        platform_stub = gateway_pb2_grpc.GatewayStub(channels[0])
        rss = await rss_rounds(platform_stub, stacks["platform"].children["memory"].pid, args.rss_rounds,
                               args.sessions, args.turns_per_session)
    finally:
        for channel in channels:
            await channel.close()
        for stack in stacks.values():
            await asyncio.to_thread(stack.stop)
        await baseline_agent.close()
        if minimal_agent is not None:
            await minimal_agent.close()
        stop.set()
        llm_process.join(5)
    platform, baseline, before, minimal = (results["platform"], results["baseline"], results.get("before"),
                                           results.get("minimal"))

    print(f"one tool-using turn (2 model calls + 1 jailed `true`); {args.turns} sequential turns each, "
          f"alternating; {args.sessions} concurrent sessions x {args.turns_per_session} turns, median of "
          f"{args.rounds} alternating rounds")
    print()
    measured = [("agentmesh before", before), ("agentmesh (5 services)", platform), ("single process", baseline),
                ("single process, minimal request", minimal)]
    columns = [(label, r) for label, r in measured if r is not None]
    ratios = [(label, a, b) for label, a, b in (("ratio before", before, baseline), ("ratio", platform, baseline),
                                                ("ratio to minimal", platform, minimal))
              if a is not None and b is not None]
    print("| measure | " + " | ".join([label for label, _ in columns] + [label for label, _, _ in ratios]) + " |")
    print("| --- |" + " --- |" * (len(columns) + len(ratios)))
    for key, label in (("p50_ms", "p50 latency (ms)"), ("p99_ms", "p99 latency (ms)"), ("turns_per_s", f"turns/s, {args.sessions} sessions")):
        cells = [f"{r[key]:.1f}" for _, r in columns] + [f"{a[key] / b[key]:.2f}x" for _, a, b in ratios]
        print(f"| {label} | " + " | ".join(cells) + " |")
    print("\nCPU per turn by service over the sequential turns (ms):\n")
    stacks_measured = [name for name in ("before", "platform") if name in results]
    print("| service | " + " | ".join("agentmesh before" if n == "before" else "agentmesh" for n in stacks_measured) + " |")
    print("| --- |" + " --- |" * len(stacks_measured))
    for service in [*results["platform"]["cpu_ms"], "all four"]:
        cells = []
        for name in stacks_measured:
            used = results[name]["cpu_ms"]
            cells.append(f"{sum(used.values()) if service == 'all four' else used.get(service, float('nan')):.2f}")
        print(f"| {service} | " + " | ".join(cells) + " |")
    if rss:
        warm = rss[0]
        print(f"\nmemory service RSS after each further round of {args.sessions} sessions x {args.turns_per_session} turns: "
              + ", ".join(f"{r:.1f}" for r in rss) + " MB; change after the first (warm) round: "
              + f"{(max(rss[1:], default=warm) - warm) / warm * 100:+.1f}% at most")
    print(f"load average {load_before:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--turns-per-session", type=int, default=4)
    parser.add_argument("--rss-rounds", type=int, default=4, help="rounds of the concurrent load to sample RSS after")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of the concurrent load (median)")
    parser.add_argument("--before-python", default="", help="also run the services with this interpreter (another checkout)")
    parser.add_argument("--minimal-baseline", action="store_true",
                        help="also measure the earlier baseline: one tool and no system prompt in its model requests")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
