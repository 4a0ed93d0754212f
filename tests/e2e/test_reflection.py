"""Reflection end to end: a session where a command fails and is corrected produces a learning;
a new session of the namespace recalls it before its first model call (and says so in a status
event); reflecting again adds nothing; a contradicting learning supersedes; a malformed answer
fails, is recorded, and the stretch is reflected again later; another namespace never sees it.
All five services over real gRPC, the model a scripted OpenAI-compatible HTTP server."""

from __future__ import annotations

import json

import grpc

from agentmesh.internal.v1 import memory_service_pb2
from agentmesh.v1 import learning_pb2
from tests.e2e.conftest import chat, of_kind, rpc_error
from tests.e2e.test_auth_and_cli import run_cli
from tests.e2e.test_standing_instructions import session_in, system_of, user_memory_stub
from tests.support.llm_server import reply, tool_call

LEARNING = "ran `python`, which is not installed -> run scripts with python3"


def extraction(correction: str = "run scripts with python3", knowledge: str = "python3 -c 'print(6*7)' prints 42"):
    return reply(json.dumps({
        "knowledge": [{"key": "answer command", "text": knowledge}],
        "learnings": [{"key": "python interpreter", "mistake": "ran `python`, which is not installed",
                       "correction": correction}],
        "skills": [{"name": "run-python", "description": "Run a Python snippet in the sandbox.",
                    "body": "Use `python3 -c '...'`; `python` is not installed."}],
    }))


async def reflect(gateway, session_id: str) -> learning_pb2.ReflectionRun:
    return (await gateway.Reflect(learning_pb2.ReflectRequest(session_id=session_id), timeout=60)).run


async def learnings(stub, namespace: str) -> list:
    reply_ = await stub.ListMemories(memory_service_pb2.ListMemoriesRequest(
        namespace=namespace, filter=memory_service_pb2.MemoryFilter(kinds=["learning", "knowledge"])), timeout=10)
    return list(reply_.memories)


async def test_a_corrected_mistake_becomes_a_learning_the_next_session_recalls(stack, llm):
    gateway = stack.gateway_stub()
    await session_in(gateway, "fix", "team-a")
    llm.add(
        reply("", tool_call("shell", {"command": "python -c 'print(6*7)'"})),
        reply("", tool_call("shell", {"command": "python3 -c 'print(6*7)'"})),
        reply("It is 42."),
    )
    events = await chat(gateway, "fix", "what is six times seven, computed in python?")
    failed, fixed = (r.result for r in of_kind(events, "tool_result"))
    assert failed.is_error and not fixed.is_error and "42" in fixed.output

    llm.add(extraction())
    code, out, err = await run_cli(stack, "reflect", "fix", "--json")
    assert code == 0, err
    run = json.loads(out)
    assert (run["status"], run["added"], run["skill_drafts"], run["model_calls"]) == ("done", "2", "1", "1")
    assert run["seq_from"] == "1" and int(run["seq_to"]) == 6 and run["model"] == "test-model"
    # The model read the failure and its correction.
    transcript = llm.requests[-1].body["messages"][-1]["content"]
    assert "python -c 'print(6*7)'" in transcript and "python3 -c 'print(6*7)'" in transcript

    memory = user_memory_stub(stack)
    stored = {m.kind: m for m in await learnings(memory, "team-a")}
    learning = stored["learning"]
    assert learning.text == LEARNING
    provenance = dict(learning.metadata)
    assert provenance["session_id"] == "fix" and provenance["dedup_key"] == "python interpreter"
    assert (provenance["seq_from"], provenance["seq_to"], provenance["model"]) == (1, 6, "test-model")
    drafts = await memory.ListSkills(learning_pb2.ListSkillsRequest(namespace="team-a", include_drafts=True), timeout=10)
    assert [(s.name, s.status, s.source) for s in drafts.skills] == [("run-python", "draft", "reflection:fix")]

    # A new session of the namespace recalls the learning before its first model call.
    await session_in(gateway, "fresh", "team-a")
    calls_before = len(llm.requests)
    llm.add(reply("Use python3."))
    events = await chat(gateway, "fresh", "How should I run python scripts here?")
    statuses = [s.message for s in of_kind(events, "status")]
    assert f"recalled a learning: {LEARNING}" in statuses
    assert LEARNING in system_of(llm.requests[-1])
    assert len(llm.requests) == calls_before + 1  # in the prompt of its very first model call

    # Reflecting again on the same stretch: no model call, nothing added.
    calls = len(llm.requests)
    again = await reflect(gateway, "fix")
    assert (again.status, again.added, again.model_calls) == ("nothing new", 0, 0) and len(llm.requests) == calls
    assert len(await learnings(memory, "team-a")) == 2

    # Another namespace never sees it.
    await session_in(gateway, "outsider", "team-b")
    llm.add(reply("No idea."))
    events = await chat(gateway, "outsider", "How should I run python scripts here?")
    assert LEARNING not in system_of(llm.requests[-1])
    assert not any(s.message.startswith("recalled a learning") for s in of_kind(events, "status"))
    assert await learnings(memory, "team-b") == []

    # A later session finds the same subject differently: it supersedes, the rest is unchanged.
    llm.add(extraction(correction="run scripts with /usr/bin/python3 -I"))
    newer = await reflect(gateway, "fresh")
    assert (newer.status, newer.added, newer.superseded, newer.unchanged) == ("done", 0, 1, 1)
    stored = {m.kind: m for m in await learnings(memory, "team-a")}
    assert stored["learning"].text.endswith("-> run scripts with /usr/bin/python3 -I")
    assert dict(stored["learning"].metadata)["supersedes"] == LEARNING
    assert len(await learnings(memory, "team-a")) == 2

    code, out, _ = await run_cli(stack, "reflect", "history", "--namespace", "team-a", "--json")
    history = json.loads(out)
    assert [(r["session_id"], r["status"]) for r in history] == [("fresh", "done"), ("fix", "nothing new"), ("fix", "done")]


async def test_a_failed_reflection_is_recorded_and_the_stretch_is_tried_again(stack, llm):
    gateway = stack.gateway_stub()
    await session_in(gateway, "s", "team-a")
    llm.add(reply("Hello."))
    await chat(gateway, "s", "hi")

    llm.add(reply("I think the session went well."))  # not the JSON asked for
    failed = await reflect(gateway, "s")
    assert failed.status == "failed" and failed.error == "the reflection is not a JSON object"

    llm.add(extraction())
    retried = await reflect(gateway, "s")
    assert (retried.status, retried.seq_from, retried.added) == ("done", 1, 2)  # the same stretch, read again

    unknown = await rpc_error(gateway.Reflect(learning_pb2.ReflectRequest(session_id="never-made"), timeout=10))
    assert unknown.code() == grpc.StatusCode.NOT_FOUND
