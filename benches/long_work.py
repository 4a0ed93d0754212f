"""Long work: compaction over a long session, and sub-agents running in parallel, each beside
its baseline measured in the same run.

    .venv/bin/python -m benches.long_work [--turns 60] [--budget 40000] [--tasks 4] [--delay-ms 200] [--repeats 3]
                                          [--steps 50] [--output-chars 8000] [--answer-chars 6000] [--cuts 2]

Both parts drive `agentmesh.agent.loop.Agent` with the real OpenAI provider over httpx against
the scripted OpenAI-compatible server (tests/support/llm_server.py), with an in-process no-op
tool and an in-memory transcript, as benches/agent_loop.py does. No gRPC, no sandbox.

1. **Compaction.** One session of `--turns` turns; every user message and every answer is
   about 2,000 characters and starts with a marker (`[U07]`, `[A07]`). The model answers at
   once. `AGENTMESH_AGENT_CONTEXT_BUDGET_CHARS` is `--budget`. On: the default policy
   (summarise the oldest turns past 3/4 of the budget). Off (`AGENTMESH_AGENT_COMPACTION=false`,
   the baseline): the oldest turns are dropped to fit. The scripted summariser answers with the
   list of `[Unn]` markers it was given (from the old messages and the earlier summary) plus
   ~1,500 characters of filler, so what a summary covers is measurable; a real model's summary
   is lossier than a marker list, so "covered by a summary" means "the summariser was shown
   it", not "every detail survives". Characters are the message contents of each request the
   server received (what the budget counts, less per-message overhead); tokens are what the
   server reports, which it computes as the request's JSON size / 4 (the scripted server has no
   tokenizer), summed by the agent into the turn's `usage`.
2. **Sub-agents.** One deep-mode turn: the plan call, then one reply with N `delegate_task`
   calls; each child makes 2 model calls (a no-op tool call, then its answer); then the parent's
   answer. Every model call takes `--delay-ms` at the server. The baseline is the same deep
   turn with delegation off (`SUBAGENT_MAX_DEPTH=0`) doing the same N tasks itself, one after
   another: the plan call, N x 2 tool-using calls, the answer.
3. **Per-step trimming.** One deep-mode turn of `--steps` tool-using steps (the plan, reflections
   every 8 steps, the wrap-up hint and the forced summary included); every tool result is
   `--output-chars` characters. On: the default `KEEP_TOOL_RESULTS=8` (older results of the turn
   sent as a one-line placeholder). Off (`KEEP_TOOL_RESULTS=0`, the baseline): every result sent
   in full, cut to `TOOL_OUTPUT_CHARS` and left to the budget policy (`CONTEXT_BUDGET_CHARS`,
   default 400,000, replaces the oldest outputs only when the turn no longer fits).
4. **Continuation.** One answer of `--answer-chars` characters that the server cuts off `--cuts`
   times (`finish_reason: "length"`), continued and stitched by the agent; the baseline is the
   same answer in one reply. Cost: model calls, characters and tokens sent, wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import statistics
import subprocess
import time

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

from agentmesh.agent.capabilities import compaction, deep, subagents
from agentmesh.agent.capabilities.registry import for_turn
from agentmesh.agent.loop.run import Agent, TurnRequest
from agentmesh.agent.providers import OpenAIProvider, RetryPolicy, http_client
from agentmesh.agent.settings import AgentSettings
from agentmesh.agent.types import RunFinishedEvent, ToolSpec
from agentmesh.logs import configure_logging
from agentmesh.telemetry import Telemetry
from benches.agent_loop import TOOL, MemoryTranscripts, NoopTools
from tests.support.llm_server import RecordedRequest, ScriptedLLMServer, reply, tool_call

USER_MARK = re.compile(r"\[U(\d{2,3})\]")
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet")


def filler(chars: int, seed: int) -> str:
    words = (WORDS[(seed + i * 7) % len(WORDS)] for i in range(chars))
    return " ".join(words)[:chars]


def content_chars(request: RecordedRequest) -> int:
    return sum(len(m.get("content") or "") for m in request.messages)


def with_usage(request: RecordedRequest, step):
    """The scripted server has no tokenizer: it reports the request's JSON size / 4 as prompt tokens."""
    prompt = len(json.dumps(request.messages)) // 4
    return reply(step.text, *step.tool_calls, usage=(prompt, max(1, len(step.text) // 4)), chunk_chars=512,
                 delay_s=step.delay_s, finish_reason=step.finish_reason)


def make_agent(llm: ScriptedLLMServer, telemetry: Telemetry, env: dict[str, str], tools: list[ToolSpec]):
    client = http_client(30, 5, telemetry)
    provider = OpenAIProvider(client, llm.base_url, "", RetryPolicy())
    settings = AgentSettings.from_env({"AGENTMESH_AGENT_RECALL_K": "0", **env})
    agent = Agent(provider, NoopTools(tools), MemoryTranscripts(), None, settings, model="m", telemetry=telemetry,
                  capabilities=for_turn)
    return agent, client


async def run_turn(agent: Agent, request: TurnRequest) -> RunFinishedEvent:
    events = [e async for e in agent.start(request).events()]
    if not isinstance(events[-1], RunFinishedEvent):
        raise RuntimeError(f"turn {request.run_id} did not finish: {events[-1]}")
    return events[-1]


# --- 1. compaction --------------------------------------------------------------------------


def compaction_answer(request: RecordedRequest):
    messages = request.messages
    if messages and messages[0].get("content") == compaction.INSTRUCTION:
        given = sorted({int(n) for n in USER_MARK.findall(messages[-1].get("content") or "")})
        marks = " ".join(f"[U{n:02d}]" for n in given)
        return with_usage(request, reply(f"Covered user messages: {marks}\n" + filler(1500, len(given))))
    last_user = next(m for m in reversed(messages) if m["role"] == "user")
    n = int(USER_MARK.match(last_user["content"]).group(1))
    return with_usage(request, reply(f"[A{n:02d}] " + filler(2000, n + 3)))


async def compaction_session(llm: ScriptedLLMServer, telemetry: Telemetry, *, on: bool, turns: int,
                             budget: int) -> dict:
    env = {"AGENTMESH_AGENT_CONTEXT_BUDGET_CHARS": str(budget), "AGENTMESH_AGENT_COMPACTION": str(on).lower()}
    agent, client = make_agent(llm, telemetry, env, [])
    session = f"long-{'on' if on else 'off'}-{time.monotonic_ns()}"
    main_chars, sent_chars, tokens, walls, compacting = [], [], [], [], []
    summary_calls = calls = 0
    last_main: RecordedRequest | None = None
    try:
        for n in range(1, turns + 1):
            before = len(llm.requests)
            started = time.perf_counter()
            done = await run_turn(agent, TurnRequest(session, f"r{n}", f"[U{n:02d}] " + filler(2000, n)))
            walls.append((time.perf_counter() - started) * 1000)
            mine = llm.requests[before:]
            summaries = [r for r in mine if r.messages[0].get("content") == compaction.INSTRUCTION]
            main = [r for r in mine if r not in summaries]
            summary_calls += len(summaries)
            if summaries:
                compacting.append(walls[-1])
            calls += len(mine)
            main_chars.append(content_chars(main[-1]))
            sent_chars.append(sum(content_chars(r) for r in mine))
            tokens.append(done.usage.input_tokens)
            last_main = main[-1]
    finally:
        await client.aclose()
    verbatim, summarised = set(), set()
    for m in last_main.messages:
        found = {int(x) for x in USER_MARK.findall(m.get("content") or "")}
        if m["role"] == "user":
            verbatim |= found
        elif m["role"] == "system" and (m.get("content") or "").startswith("Summary of this conversation"):
            summarised |= found
    return {
        "main_p50": statistics.median(main_chars), "main_max": max(main_chars),
        "sent_p50": statistics.median(sent_chars), "sent_max": max(sent_chars), "sent_total": sum(sent_chars),
        "tok_p50": statistics.median(tokens), "tok_max": max(tokens),
        "summary_calls": summary_calls, "calls": calls,
        "verbatim": len(verbatim), "summarised": len(summarised - verbatim),
        "represented": len(verbatim | summarised),
        "wall_p50": statistics.median(walls), "wall_max": max(walls),
        "wall_compacting": statistics.median(compacting) if compacting else None,
    }


# --- 2. sub-agents --------------------------------------------------------------------------


def subagent_answer(tasks: int, delay_s: float):
    def answer(request: RecordedRequest):
        messages = request.messages
        last = messages[-1]
        tool_names = {t["function"]["name"] for t in (request.body.get("tools") or [])}
        if last["role"] == "system" and last["content"].startswith(deep.PLAN_INSTRUCTION.split(":")[0]):
            plan = "\n".join(f"{k}. do task {k}" for k in range(1, tasks + 1)) + f"\n{tasks + 1}. answer"
            step = reply(plan)
        elif subagents.SUBAGENT_NOTE in (messages[0].get("content") or ""):  # a child
            # Keyed on a result being there, not on the last message (a wrap-up note may follow it).
            done = any(m["role"] == "tool" for m in messages)
            step = reply("task done: ok") if done else reply("", tool_call("noop", {}))
        elif subagents.DELEGATE_TASK in tool_names:  # the delegating parent
            if last["role"] == "tool":
                step = reply(f"all {tasks} tasks done")
            else:
                step = reply("", *(tool_call(subagents.DELEGATE_TASK, {"task": f"do task {k}", "max_iterations": 2})
                                   for k in range(1, tasks + 1)))
        else:  # the baseline: the parent does the N tasks itself, 2 tool-using calls each
            results = sum(1 for m in messages if m["role"] == "tool")
            step = reply(f"all {tasks} tasks done") if results >= 2 * tasks else reply("", tool_call("noop", {"n": results}))
        return with_usage(request, reply(step.text, *step.tool_calls, delay_s=delay_s))

    return answer


async def deep_turn(llm: ScriptedLLMServer, telemetry: Telemetry, *, delegate: bool, tasks: int, label: str) -> dict:
    env = {"AGENTMESH_AGENT_SUBAGENT_MAX_DEPTH": "1" if delegate else "0",
           "AGENTMESH_AGENT_MAX_SUBAGENTS": str(max(tasks, 1)),
           "AGENTMESH_AGENT_DEEP_REFLECT_EVERY": "0",  # no reflection: the same calls on both sides
           "AGENTMESH_AGENT_TASK_MODES": "none"}  # the free-text plan: this measures parallelism, not the board
    agent, client = make_agent(llm, telemetry, env, [TOOL])
    try:
        before = len(llm.requests)
        started = time.perf_counter()
        done = await run_turn(agent, TurnRequest(f"deep-{label}", f"r-{label}", f"do {tasks} tasks", mode="deep"))
        wall = time.perf_counter() - started
    finally:
        await client.aclose()
    if done.stop_reason != "completed":
        raise RuntimeError(f"deep turn ended with {done.stop_reason}")
    return {"wall": wall, "calls": len(llm.requests) - before, "parent_calls": done.iterations}


# --- 3. per-step trimming --------------------------------------------------------------------


class BigOutputTools(NoopTools):
    """A tool whose every result is `chars` characters (a build log, a long file)."""

    def __init__(self, chars: int):
        super().__init__([TOOL])
        self.chars = chars

    async def execute(self, session_id, call):
        result = await super().execute(session_id, call)
        result.output = filler(self.chars, len(call.call_id))
        return result


def long_deep_answer(request: RecordedRequest):
    if request.body.get("tool_choice") == "none":  # plan, reflection, the forced summary
        return with_usage(request, reply("1. read every log\n2. report"))
    steps = sum(1 for m in request.messages if m["role"] == "tool")
    return with_usage(request, reply("", tool_call("noop", {"part": steps})))


async def trimming_turn(llm: ScriptedLLMServer, telemetry: Telemetry, *, keep: int, steps: int, chars: int) -> dict:
    env = {"AGENTMESH_AGENT_KEEP_TOOL_RESULTS": str(keep), "AGENTMESH_AGENT_DEEP_MAX_ITERATIONS": str(steps),
           "AGENTMESH_AGENT_TASK_MODES": "none"}  # no board: the model here never finishes tasks
    client = http_client(30, 5, telemetry)
    provider = OpenAIProvider(client, llm.base_url, "", RetryPolicy())
    settings = AgentSettings.from_env({"AGENTMESH_AGENT_RECALL_K": "0", **env})
    agent = Agent(provider, BigOutputTools(chars), MemoryTranscripts(), None, settings, model="m", telemetry=telemetry,
                  capabilities=for_turn)
    try:
        before = len(llm.requests)
        started = time.perf_counter()
        done = await run_turn(agent, TurnRequest(f"trim-{keep}-{time.monotonic_ns()}", "r", "read the logs", mode="deep"))
        wall = time.perf_counter() - started
    finally:
        await client.aclose()
    mine = llm.requests[before:]
    sent = [content_chars(r) for r in mine]
    return {"calls": len(mine), "sent_total": sum(sent), "sent_p50": statistics.median(sent), "sent_max": max(sent),
            "tokens": done.usage.input_tokens, "wall": wall, "stop": done.stop_reason}


# --- 4. continuation ----------------------------------------------------------------------------


def cut_answer(total_chars: int, cuts: int):
    text = filler(total_chars, 11)
    size = -(-total_chars // (cuts + 1))
    parts = [text[i:i + size] for i in range(0, total_chars, size)]

    offsets = [len("".join(parts[:k])) for k in range(len(parts))]

    def answer(request: RecordedRequest):
        last_message = request.messages[-1]
        continuing = last_message["role"] == "system" and "cut off" in last_message["content"]
        index = offsets.index(len(request.messages[-2]["content"])) if continuing else 0
        last = index == len(parts) - 1
        return with_usage(request, reply(parts[index], finish_reason=None if last else "length"))

    return answer, text


async def continuation_turn(llm: ScriptedLLMServer, telemetry: Telemetry, text: str) -> dict:
    agent, client = make_agent(llm, telemetry, {}, [])
    try:
        before = len(llm.requests)
        started = time.perf_counter()
        done = await run_turn(agent, TurnRequest(f"cont-{time.monotonic_ns()}", "r", "write it all"))
        wall = time.perf_counter() - started
    finally:
        await client.aclose()
    if done.final_text != text:
        raise RuntimeError("the stitched answer differs from the original")
    mine = llm.requests[before:]
    return {"calls": len(mine), "sent": sum(content_chars(r) for r in mine), "tokens": done.usage.input_tokens,
            "out_tokens": done.usage.output_tokens, "wall_ms": wall * 1000}


# --- driver ---------------------------------------------------------------------------------


def machine() -> str:
    try:
        model = next((line.split(":", 1)[1].strip() for line in subprocess.run(
            ["lscpu"], capture_output=True, text=True, check=False).stdout.splitlines() if line.startswith("Model name")), "?")
    except OSError:
        model = platform.processor() or "?"
    try:
        with open("/proc/meminfo") as f:
            mem_gib = int(f.readline().split()[1]) / 1024 / 1024
    except OSError:
        mem_gib = 0
    load = os.getloadavg()[0]
    return (f"machine: {model}, {os.cpu_count()} cores, {mem_gib:.0f} GiB, Python {platform.python_version()}, "
            f"load average {load:.1f}")


async def main(args) -> None:
    configure_logging("bench", "warning")  # the agent's info lines would drown the tables
    telemetry = Telemetry("agent", TracerProvider(), MeterProvider())
    print(machine())
    print()

    with ScriptedLLMServer(default=compaction_answer) as llm:
        # Warm-up (imports, connections), then off and on in the same run.
        await compaction_session(llm, telemetry, on=True, turns=3, budget=args.budget)
        results = {"off": await compaction_session(llm, telemetry, on=False, turns=args.turns, budget=args.budget),
                   "on": await compaction_session(llm, telemetry, on=True, turns=args.turns, budget=args.budget)}
    print(f"1. compaction: one session of {args.turns} turns, user message and answer ~2,000 characters each, "
          f"CONTEXT_BUDGET_CHARS={args.budget:,}, model answers at once")
    print()
    print("| measure | compaction off (baseline: drop oldest) | compaction on |")
    print("| --- | --- | --- |")
    off, on = results["off"], results["on"]
    rows = (
        ("context chars per turn, p50 / max (the turn's answering call)", "main_p50", "main_max", "{:,.0f}"),
        ("chars sent per turn incl. summary calls, p50 / max", "sent_p50", "sent_max", "{:,.0f}"),
        ("input tokens per turn (server-reported, JSON/4), p50 / max", "tok_p50", "tok_max", "{:,.0f}"),
    )
    for label, a, b, fmt in rows:
        print(f"| {label} | {fmt.format(off[a])} / {fmt.format(off[b])} | {fmt.format(on[a])} / {fmt.format(on[b])} |")
    print(f"| chars sent over all {args.turns} turns | {off['sent_total']:,} | {on['sent_total']:,} |")
    print(f"| summarising calls over {args.turns} turns | {off['summary_calls']} | {on['summary_calls']} |")
    print(f"| model calls in total | {off['calls']} | {on['calls']} |")
    for key, label in (("represented", f"user messages of {args.turns} represented at turn {args.turns}"),
                       ("verbatim", "… kept verbatim"), ("summarised", "… covered by the summary only")):
        print(f"| {label} | {off[key]} | {on[key]} |")
    print(f"| wall ms per turn, p50 / max | {off['wall_p50']:.1f} / {off['wall_max']:.1f} | "
          f"{on['wall_p50']:.1f} / {on['wall_max']:.1f} |")
    shown = ["—" if r["wall_compacting"] is None else f"{r['wall_compacting']:.1f}" for r in (off, on)]
    print(f"| wall ms of a turn that compacts (2 model calls), p50 | {shown[0]} | {shown[1]} |")
    print()

    delay_s = args.delay_ms / 1000
    with ScriptedLLMServer(default=subagent_answer(args.tasks, delay_s)) as llm:
        await deep_turn(llm, telemetry, delegate=True, tasks=1, label="warm")
        runs: dict[str, list[dict]] = {"single": [], "sub": []}
        for r in range(args.repeats):  # alternate the order so a busy machine favours neither
            for name in ("single", "sub") if r % 2 == 0 else ("sub", "single"):
                runs[name].append(await deep_turn(llm, telemetry, delegate=name == "sub", tasks=args.tasks,
                                                  label=f"{name}-{r}"))
    telemetry.shutdown()
    single = statistics.median(x["wall"] for x in runs["single"])
    sub = statistics.median(x["wall"] for x in runs["sub"])
    print(f"2. sub-agents: one deep-mode turn, {args.tasks} independent tasks of 2 model calls each, every model call "
          f"{args.delay_ms} ms at the server; median of {args.repeats}")
    print()
    print("| variant | wall s (median) | min / max s | model calls (parent's own) |")
    print("| --- | --- | --- | --- |")
    for name, label, wall in (("single", f"baseline: one agent, {args.tasks} tasks in turn", single),
                              ("sub", f"{args.tasks} sub-agents in parallel (delegate_task)", sub)):
        walls = [x["wall"] for x in runs[name]]
        print(f"| {label} | {wall:.2f} | {min(walls):.2f} / {max(walls):.2f} | "
              f"{runs[name][0]['calls']} ({runs[name][0]['parent_calls']}) |")
    print(f"\nspeedup: {single / sub:.2f}x (sequential model time alone would be "
          f"{runs['single'][0]['calls'] * args.delay_ms / 1000:.2f} s vs "
          f"{(runs['sub'][0]['parent_calls'] + 2) * args.delay_ms / 1000:.2f} s on the critical path)")

    telemetry = Telemetry("agent", TracerProvider(), MeterProvider())
    with ScriptedLLMServer(default=long_deep_answer) as llm:
        await trimming_turn(llm, telemetry, keep=8, steps=5, chars=args.output_chars)  # warm-up
        trim = {"off": await trimming_turn(llm, telemetry, keep=0, steps=args.steps, chars=args.output_chars),
                "on": await trimming_turn(llm, telemetry, keep=8, steps=args.steps, chars=args.output_chars)}
    off, on = trim["off"], trim["on"]
    print()
    print(f"3. per-step trimming: one deep-mode turn of {args.steps} tool-using steps, every tool result "
          f"{args.output_chars:,} characters (plan, reflections, wrap-up and the forced summary included)")
    print()
    print("| measure | trimming off (KEEP_TOOL_RESULTS=0, baseline) | trimming on (KEEP_TOOL_RESULTS=8) |")
    print("| --- | --- | --- |")
    print(f"| model calls | {off['calls']} | {on['calls']} |")
    print(f"| characters sent over the turn | {off['sent_total']:,} | {on['sent_total']:,} |")
    print(f"| characters sent per call, p50 / max | {off['sent_p50']:,.0f} / {off['sent_max']:,} | "
          f"{on['sent_p50']:,.0f} / {on['sent_max']:,} |")
    print(f"| input tokens over the turn (server-reported, JSON/4) | {off['tokens']:,} | {on['tokens']:,} |")
    print(f"| wall s | {off['wall']:.2f} | {on['wall']:.2f} |")
    print(f"\nsent with trimming: {on['sent_total'] / off['sent_total']:.1%} of the baseline")

    answer, text = cut_answer(args.answer_chars, args.cuts)
    with ScriptedLLMServer(default=answer) as llm:
        await continuation_turn(llm, telemetry, text)  # warm-up
        cut = await continuation_turn(llm, telemetry, text)
    whole_answer = lambda request: with_usage(request, reply(text))  # noqa: E731 - the baseline's script
    with ScriptedLLMServer(default=whole_answer) as llm:
        await continuation_turn(llm, telemetry, text)
        whole = await continuation_turn(llm, telemetry, text)
    telemetry.shutdown()
    print()
    print(f"4. continuation: one answer of {args.answer_chars:,} characters, cut off {args.cuts} times by the output "
          "limit and continued, against the same answer in one reply")
    print()
    print("| measure | one reply (baseline) | cut off and continued |")
    print("| --- | --- | --- |")
    print(f"| model calls | {whole['calls']} | {cut['calls']} |")
    print(f"| characters sent | {whole['sent']:,} | {cut['sent']:,} |")
    print(f"| input tokens (server-reported, JSON/4) | {whole['tokens']:,} | {cut['tokens']:,} |")
    print(f"| output tokens | {whole['out_tokens']:,} | {cut['out_tokens']:,} |")
    print(f"| wall ms | {whole['wall_ms']:.1f} | {cut['wall_ms']:.1f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--budget", type=int, default=40_000)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--delay-ms", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--output-chars", type=int, default=8000)
    parser.add_argument("--answer-chars", type=int, default=6000)
    parser.add_argument("--cuts", type=int, default=2)
    asyncio.run(main(parser.parse_args()))
