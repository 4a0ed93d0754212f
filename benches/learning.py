"""What learning costs: the prompt size standing instructions, skills and promoted tools add to a
turn (against a turn of a namespace without them, in the same run), the time a turn takes with
and without them (they are read from the memory service at every turn's start), and what
reflecting on a session costs (model calls, tokens, wall time) by session length.

All five services in this process on real ports (tests/support/stack.py), the model the scripted
OpenAI-compatible server, which answers at once: what is measured is what agentmesh sends.
Tokens are estimated as characters / 4 (the context budget's own rule); the scripted server's
usage numbers are not a model's.

    python -m benches.learning [--skills 5] [--sessions-of 2,8,32] [--turns 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from agentmesh.v1 import gateway_pb2, learning_pb2
from tests.support.llm_server import ScriptedLLMServer, reply, tool_call
from tests.support.stack import Stack

SOUL = ("You are Quill, the release engineer of this team. Be terse and exact; prefer commands to prose; say "
        "when you are unsure. Never push to main without a green pipeline. Sign off with '-- Q'.")
USER = ("The user is Ada, a backend engineer. She reads answers on a phone between meetings: lead with the answer, "
        "then at most five bullet points. Time zone: Europe/Berlin.")
PROJECT = ("agentmesh: Python 3.11 gRPC services (gateway, agent, tools, memory, scheduler). Tests: make test. "
           "Lint: ruff. Releases are tagged vX.Y.Z from main; the changelog lives in CHANGELOG.md. Deploys go "
           "through the Helm chart in helm/agentmesh; staging first, then production after a day.")
TOOL_SOURCE = '''
def word_count(text: str, min_length: int = 1) -> int:
    """Count the words of `text` that have at least `min_length` characters."""
    return len([w for w in text.split() if len(w) >= min_length])
'''


def skill_md(i: int) -> str:
    return (f"---\nname: skill-{i}\ndescription: \"Procedure {i} - how this team does task number {i}, step by step, "
            f"with the commands that work.\"\n---\n# Skill {i}\n\n" + "Do the thing carefully.\n" * 20)


def request_sizes(request, only: tuple[str, ...] = ()) -> tuple[int, int]:
    """(system prompt chars, tool definitions chars — of `only` when given) of one model request."""
    body = request.body
    tools = [t for t in body.get("tools", []) if not only or t["function"]["name"] in only]
    return len(body["messages"][0]["content"]), len(json.dumps(tools, separators=(",", ":")))


def extraction(n: int) -> str:
    return json.dumps({
        "knowledge": [{"key": f"fact {i}", "text": f"command {i} works: make target-{i}"} for i in range(n)],
        "learnings": [{"key": "python interpreter", "mistake": "ran python", "correction": "use python3"}],
        "skills": [],
    })


async def measure_prompt(stack: Stack, llm: ScriptedLLMServer, skills: int) -> list[tuple[str, int, int]]:
    gateway = stack.gateway_stub()
    for part, text in (("soul", SOUL), ("user", USER), ("project", PROJECT)):
        await gateway.SetProfile(learning_pb2.SetProfileRequest(namespace="rich", part=part, text=text), timeout=10)
    for i in range(skills):
        await gateway.PutSkill(learning_pb2.PutSkillRequest(
            namespace="rich", files=[learning_pb2.SkillFile(path="SKILL.md", content=skill_md(i))]), timeout=10)
    rows = []
    for namespace in ("plain", "rich"):
        session = f"prompt-{namespace}"
        await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id=session, namespace=namespace), timeout=10)
        if namespace == "rich":  # one promoted tool, made the way the agent makes it
            llm.add(reply("", tool_call("write_file", {"path": "t.py", "content": TOOL_SOURCE})),
                    reply("", tool_call("promote_skill", {"path": "t.py", "function": "word_count",
                                                          "tool_name": "word_count"})),
                    reply("ok"))
            await _chat(gateway, session, "make a tool")
        before = len(llm.requests)
        llm.add(reply("ok"))
        await _chat(gateway, session, "What is the status of the release?")
        system, tools = request_sizes(llm.requests[before])
        rows.append((namespace, system, tools))
        if namespace == "plain":
            rows.append(("always", 0, request_sizes(llm.requests[before], ("promote_skill", "read_skill"))[1]))
    return rows


async def measure_turn_time(stack: Stack, llm: ScriptedLLMServer, turns: int) -> dict[str, list[float]]:
    """Wall time of a one-call turn in each namespace, alternating so both see the same load."""
    gateway = stack.gateway_stub()
    times: dict[str, list[float]] = {"plain": [], "rich": []}
    for i in range(turns):
        for namespace in ("plain", "rich"):
            llm.add(reply("ok"))
            started = time.perf_counter()
            await _chat(gateway, f"prompt-{namespace}", f"status {i}?")
            times[namespace].append((time.perf_counter() - started) * 1000)
    return times


async def _chat(gateway, session: str, message: str) -> None:
    async for _ in gateway.Chat(gateway_pb2.ChatRequest(session_id=session, message=message), timeout=60):
        pass


async def measure_reflection(stack: Stack, llm: ScriptedLLMServer, turns: int) -> dict:
    gateway = stack.gateway_stub()
    session = f"reflect-{turns}"
    await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id=session, namespace="rich"), timeout=10)
    for i in range(turns):  # each turn: a tool call with some output, then an answer
        llm.add(reply("", tool_call("shell", {"command": f"seq 1 40 | sed 's/^/line {i} /'"})),
                reply(f"Turn {i}: the listing has 40 lines, as expected."))
        await _chat(gateway, session, f"List forty lines for step {i} and check them.")
    answer = extraction(3)
    before = len(llm.requests)
    llm.add(reply(answer))
    started = time.perf_counter()
    first = (await gateway.Reflect(learning_pb2.ReflectRequest(session_id=session), timeout=120)).run
    first_s = time.perf_counter() - started
    sent = sum(len(m["content"] or "") for m in llm.requests[before].body["messages"])
    started = time.perf_counter()
    second = (await gateway.Reflect(learning_pb2.ReflectRequest(session_id=session), timeout=120)).run
    second_s = time.perf_counter() - started
    return {"turns": turns, "entries": first.seq_to - first.seq_from + 1, "calls": first.model_calls,
            "in_tokens": sent // 4, "out_tokens": len(answer) // 4, "first_ms": first_s * 1000,
            "added": first.added, "second_calls": second.model_calls, "second_ms": second_s * 1000}


async def main(skills: int, lengths: list[int], turns: int) -> None:
    with tempfile.TemporaryDirectory() as home, ScriptedLLMServer() as llm:
        async with Stack(Path(home) / "home", llm_base_url=llm.base_url) as stack:
            prompt = await measure_prompt(stack, llm, skills)
            turn_times = await measure_turn_time(stack, llm, turns)
            reflections = [await measure_reflection(stack, llm, n) for n in lengths]
    (_, base_system, base_tools), (_, _, always_tools), (_, rich_system, rich_tools) = prompt
    print(f"\nPrompt added by learning (3 instruction parts of {len(SOUL)}/{len(USER)}/{len(PROJECT)} chars, "
          f"{skills} skills, 1 promoted tool), first model call of a turn:")
    print("| measure | without (namespace with none) | with | added | ~tokens added |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| system prompt, chars | {base_system} | {rich_system} | {rich_system - base_system} | "
          f"{(rich_system - base_system) // 4} |")
    print(f"| tool definitions, chars | {base_tools} | {rich_tools} | {rich_tools - base_tools} | "
          f"{(rich_tools - base_tools) // 4} |")
    print(f"\n(`promote_skill`, offered in every turn, is {always_tools} chars (~{always_tools // 4} tokens) of the "
          "'without' tool definitions; `read_skill` is offered only in a namespace with skills.)")
    print(f"\nTurn wall time, {turns} one-call turns in each namespace, alternating (scripted model answers at once):")
    print("| namespace | p50 ms | p90 ms |")
    print("| --- | --- | --- |")
    for namespace, label in (("plain", "without"), ("rich", "with")):
        ordered = sorted(turn_times[namespace])
        print(f"| {label} | {statistics.median(ordered):.1f} | {ordered[int(len(ordered) * 0.9) - 1]:.1f} |")
    print("\nReflection per session (scripted model answers at once; 3 knowledge + 1 learning extracted):")
    print("| session turns | entries read | model calls | ~input tokens | ~output tokens | wall ms | again: model calls, ms |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in reflections:
        print(f"| {r['turns']} | {r['entries']} | {r['calls']} | {r['in_tokens']} | {r['out_tokens']} | "
              f"{r['first_ms']:.0f} | {r['second_calls']}, {r['second_ms']:.0f} |")
    per_turn = statistics.mean(r["in_tokens"] / r["turns"] for r in reflections)
    print(f"\n~{per_turn:.0f} input tokens per reflected turn (mean over the sizes)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skills", type=int, default=5)
    parser.add_argument("--sessions-of", default="2,8,32", help="session lengths in turns")
    parser.add_argument("--turns", type=int, default=30, help="turns per namespace for the turn time")
    args = parser.parse_args()
    asyncio.run(main(args.skills, [int(n) for n in args.sessions_of.split(",")], args.turns))
