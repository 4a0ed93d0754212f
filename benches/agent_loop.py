"""The agent loop's own overhead: one tool-using turn through `agentmesh.agent.loop` versus the
same work done by hand, in the same run.

    .venv/bin/python -m benches.agent_loop [--turns 300] [--concurrency 32]

Both sides (interleaved turn by turn, so a busy machine does not favour one) talk to the same scripted OpenAI-compatible server over real HTTP (model answers
at once: a tool call, then a final text) and run an in-process no-op tool, so the difference
is what the loop adds: context assembly, SSE parsing and tool-call assembly, events, spans and
metrics (SDK providers, no exporter), transcript writes to an in-memory store. The baseline
makes the two streamed calls with httpx and a minimal SSE parse. No gRPC, no sandbox: those
are measured end to end by the platform benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Sequence

import httpx
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

from agentmesh.agent.capabilities.registry import for_turn
from agentmesh.agent.loop.run import Agent, TurnRequest
from agentmesh.agent.providers import OpenAIProvider, RetryPolicy, http_client
from agentmesh.agent.settings import AgentSettings
from agentmesh.agent.types import ChatMessage, RunFinishedEvent, ToolCall, ToolOutcome, ToolSpec
from agentmesh.telemetry import Telemetry
from tests.support.llm_server import RecordedRequest, ScriptedLLMServer, reply, tool_call

TOOL = ToolSpec("noop", "does nothing", {"type": "object", "properties": {}})


def answer(request: RecordedRequest):
    last = request.messages[-1]["role"] if request.messages else "user"
    return reply("done") if last == "tool" else reply("", tool_call("noop", {"x": 1}))


class NoopTools:
    """Tools that answer "ok" at once: what is measured is the loop, not a tool."""

    def __init__(self, tools: Sequence[ToolSpec] = (TOOL,)):
        self.tools = list(tools)

    async def list_tools(self, namespace: str = "", *, mcp_version: float | None = None) -> list[ToolSpec]:
        return list(self.tools)

    async def execute(self, session_id: str, call: ToolCall, namespace: str = "", *,
                      mcp_version: float | None = None) -> ToolOutcome:
        return ToolOutcome(call_id=call.call_id, name=call.name, output="ok")


class MemoryTranscripts:
    def __init__(self) -> None:
        self.sessions: dict[str, list[ChatMessage]] = {}

    async def load(self, session_id: str) -> list[ChatMessage]:
        return list(self.sessions.get(session_id, []))

    async def append(self, session_id: str, messages: Sequence[ChatMessage]) -> None:
        self.sessions.setdefault(session_id, []).extend(messages)


async def baseline_turn(client: httpx.AsyncClient, url: str, n: int) -> None:
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": f"turn {n}"}]
    tools = [{"type": "function", "function": {"name": TOOL.name, "description": TOOL.description,
                                               "parameters": TOOL.parameters}}]
    for _ in range(2):
        body = {"model": "m", "messages": messages, "tools": tools, "stream": True}
        calls: dict[int, dict] = {}
        text = []
        async with client.stream("POST", url, json=body) as response:
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                for choice in json.loads(line[6:]).get("choices", []):
                    delta = choice.get("delta", {})
                    text.append(delta.get("content") or "")
                    for tc in delta.get("tool_calls") or []:
                        slot = calls.setdefault(tc["index"], {"id": "", "name": "", "args": ""})
                        slot["id"] = tc.get("id") or slot["id"]
                        slot["name"] = tc.get("function", {}).get("name") or slot["name"]
                        slot["args"] += tc.get("function", {}).get("arguments") or ""
        if not calls:
            return
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["args"]}} for c in calls.values()]})
        for c in calls.values():
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": "ok"})


async def measure(variants: dict, turns: int, concurrency: int, rounds: int = 4) -> dict[str, tuple[float, ...]]:
    """Latency: one turn of each variant in turn (order swapped every time); throughput: blocks
    of concurrent turns, alternating. Interleaving keeps a busy machine from favouring one side."""
    names = list(variants)
    for i in range(10):  # warm-up: connections, imports, caches
        for name in names:
            await variants[name](10_000 + i)
    latencies: dict[str, list[float]] = {name: [] for name in names}
    cpu = dict.fromkeys(names, 0.0)
    for i in range(turns):
        for name in names if i % 2 == 0 else reversed(names):
            started, cpu_started = time.perf_counter(), time.process_time()
            await variants[name](i)
            latencies[name].append((time.perf_counter() - started) * 1000)
            cpu[name] += time.process_time() - cpu_started
    elapsed = dict.fromkeys(names, 0.0)
    per_round = max(concurrency, turns // rounds)
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            counter = iter(range(per_round))

            async def worker(turn=variants[name], counter=counter, r=r) -> None:
                for n in counter:
                    await turn(100_000 + r * per_round + n)

            started = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            elapsed[name] += time.perf_counter() - started
    out = {}
    for name in names:
        ordered = sorted(latencies[name])
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        out[name] = (statistics.median(ordered), p99, per_round * rounds / elapsed[name], cpu[name] * 1000 / turns)
    return out


async def main(turns: int, concurrency: int) -> None:
    telemetry = Telemetry("agent", TracerProvider(), MeterProvider())
    with ScriptedLLMServer(default=answer) as llm:
        client = http_client(30, 5, telemetry)
        provider = OpenAIProvider(client, llm.base_url, "", RetryPolicy())
        agent = Agent(provider, NoopTools(), MemoryTranscripts(), None, AgentSettings(recall_k=0), model="m",
                      telemetry=telemetry, capabilities=for_turn)

        async def loop_turn(n: int) -> None:
            events = [e async for e in agent.start(TurnRequest(f"s{n}", f"r{n}", f"turn {n}")).events()]
            assert isinstance(events[-1], RunFinishedEvent) and events[-1].iterations == 2, events[-1]

        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=100)) as plain:
            url = f"{llm.base_url}/chat/completions"
            results = await measure(
                {"baseline": lambda n: baseline_turn(plain, url, n), "loop": loop_turn}, turns, concurrency
            )
        await client.aclose()
    telemetry.shutdown()
    base, looped = results["baseline"], results["loop"]

    print(f"one tool-using turn (2 model calls, 1 no-op tool); {turns} turns; throughput with {concurrency} concurrent\n")
    print(f"| {'variant':<36} | {'p50 ms':>7} | {'p99 ms':>7} | {'turns/s':>8} | {'CPU ms/turn':>11} |")
    print(f"| {'-' * 36} | {'-' * 7} | {'-' * 7} | {'-' * 8} | {'-' * 11} |")
    for name, (p50, p99, tps, cpu) in (("baseline: httpx by hand", base), ("agent loop (provider, spans, events)", looped)):
        print(f"| {name:<36} | {p50:7.2f} | {p99:7.2f} | {tps:8.1f} | {cpu:11.2f} |")
    print(f"\nratio loop/baseline: p50 {looped[0] / base[0]:.2f}x, throughput {looped[2] / base[2]:.2f}x, "
          f"CPU {looped[3] / base[3]:.2f}x (CPU includes the in-process model server's thread)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    asyncio.run(main(args.turns, args.concurrency))
