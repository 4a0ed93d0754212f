"""One turn end to end across all five services, over real gRPC, with a scripted model server."""

from __future__ import annotations

import asyncio
import json

import grpc

from agentmesh.v1 import gateway_pb2, sessions_pb2
from tests.e2e.conftest import chat, collect, kinds, of_kind, rpc_error, transcript, wait_until
from tests.support.llm_server import failure, reply, tool_call
from tests.support.processes import processes_running

WAIT_FOR_FLAG = "for i in $(seq 100); do [ -f b.flag ] && echo saw-b && exit 0; sleep 0.1; done; exit 7"


async def test_two_concurrent_tool_calls_one_failing(stack, llm):
    # Call A only succeeds if call B runs while A is still waiting: proof they run concurrently.
    llm.add(
        reply("", tool_call("shell", {"command": WAIT_FOR_FLAG}), tool_call("shell", {"command": "touch b.flag; exit 3"})),
        reply("A saw B; B failed with 3."),
    )
    events = await chat(stack.gateway_stub(), "conc", "run both")

    assert kinds(events)[0] == "run_started"
    assert kinds(events)[-1] == "run_finished"
    calls = of_kind(events, "tool_call")
    results = {r.result.call_id: r.result for r in of_kind(events, "tool_result")}
    assert len(calls) == 2 and set(results) == {c.call_id for c in calls}
    first, second = (results[c.call_id] for c in calls)
    assert not first.is_error and "saw-b" in first.stdout
    assert second.is_error and second.exit_code == 3
    finished = of_kind(events, "run_finished")[0]
    assert finished.iterations == 2 and finished.final_text == "A saw B; B failed with 3."
    assert finished.usage.total_tokens > 0

    # The model's second request carries both results, in call order, the failure included.
    tool_messages = [m for m in llm.requests[1].body["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == [c.call_id for c in calls]
    assert "3" in tool_messages[1]["content"]


async def test_history_survives_restarting_every_service(stack, llm):
    gateway = stack.gateway_stub()
    llm.add(reply("Nice to meet you, Ada."))
    await chat(gateway, "work", "My name is Ada.")

    await stack.restart()

    llm.add(reply("You are Ada."))
    events = await chat(stack.gateway_stub(), "work", "What is my name?")
    assert of_kind(events, "error") == []
    assert of_kind(events, "run_finished")[0].final_text == "You are Ada."
    sent = [(m["role"], m.get("content")) for m in llm.requests[-1].body["messages"] if m["role"] != "system"]
    assert sent == [
        ("user", "My name is Ada."),
        ("assistant", "Nice to meet you, Ada."),
        ("user", "What is my name?"),
    ]
    stored = [(m.role, m.content) for m in await transcript(stack.gateway_stub(), "work")]
    assert stored == [*sent, ("assistant", "You are Ada.")]


async def test_a_second_turn_on_a_busy_session_is_refused(stack, llm):
    gateway = stack.gateway_stub()
    llm.add(reply("slow answer", delay_s=1.5))
    first = asyncio.create_task(chat(gateway, "busy", "first"))
    await asyncio.to_thread(llm.wait_for_requests, 1, 10)

    err = await rpc_error(chat(gateway, "busy", "second"))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "already running a turn" in err.details()

    events = await first
    assert of_kind(events, "run_finished")[0].final_text == "slow answer"
    assert [m.content for m in await transcript(gateway, "busy") if m.role == "user"] == ["first"]
    # Other sessions are not held up by a busy one.
    llm.add(reply("free"))
    assert of_kind(await chat(gateway, "other", "hi"), "run_finished")[0].final_text == "free"


async def test_bad_inputs_get_clear_statuses_and_write_nothing(stack, llm):
    gateway = stack.gateway_stub()
    cases = [
        (gateway_pb2.ChatRequest(session_id="s1", message=""), grpc.StatusCode.INVALID_ARGUMENT, "message is empty"),
        (gateway_pb2.ChatRequest(session_id="s1", message="   \n"), grpc.StatusCode.INVALID_ARGUMENT, "message is empty"),
        (gateway_pb2.ChatRequest(session_id="s1", message="x" * 100_001), grpc.StatusCode.INVALID_ARGUMENT, "the limit is 100000"),
        (gateway_pb2.ChatRequest(session_id="../etc", message="hi"), grpc.StatusCode.INVALID_ARGUMENT, "malformed"),
        (gateway_pb2.ChatRequest(session_id="", message="hi"), grpc.StatusCode.INVALID_ARGUMENT, "session_id is required"),
        (gateway_pb2.ChatRequest(session_id="a" * 129, message="hi"), grpc.StatusCode.INVALID_ARGUMENT, "malformed"),
        (
            gateway_pb2.ChatRequest(session_id="s1", message="hi", options=gateway_pb2.ChatOptions(max_iterations=-1)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "max_iterations",
        ),
    ]
    for request, code, words in cases:
        err = await rpc_error(collect(gateway.Chat(request, timeout=10)))
        assert err.code() == code, request
        assert words in err.details()

    err = await rpc_error(gateway.GetSession(sessions_pb2.GetSessionRequest(session_id="nope"), timeout=10))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    err = await rpc_error(gateway.DeleteSession(sessions_pb2.DeleteSessionRequest(session_id="nope"), timeout=10))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    err = await rpc_error(gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id="bad id!"), timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    err = await rpc_error(gateway.ListSessions(sessions_pb2.ListSessionsRequest(page_size=10_000), timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT

    # Nothing was written anywhere and the model was never called.
    listing = await gateway.ListSessions(sessions_pb2.ListSessionsRequest(), timeout=10)
    assert list(listing.sessions) == []
    assert llm.requests == []
    assert not (stack.settings.home / "workspaces" / "s1").exists()


async def test_model_503s_are_retried_then_the_turn_succeeds(stack, llm):
    llm.add(failure(503), failure(503), reply("third time lucky"))
    events = await chat(stack.gateway_stub(), "retry", "hi")
    assert of_kind(events, "run_finished")[0].final_text == "third time lucky"
    assert "error" not in kinds(events)
    assert len(llm.requests) == 3
    # The user's message was stored once, not once per attempt.
    assert [m.role for m in await transcript(stack.gateway_stub(), "retry")] == ["user", "assistant"]


async def test_a_model_that_stays_down_ends_the_turn_with_a_clear_error(stack, llm):
    llm.add(*[failure(503) for _ in range(10)])
    events = await chat(stack.gateway_stub(), "down", "hi")
    error = of_kind(events, "error")[0]
    assert error.code == "UNAVAILABLE"
    assert llm.base_url.split("//")[1].split("/")[0] in error.message
    assert "sk-test-secret" not in error.message


async def test_cancel_in_the_middle_of_a_tool_call_kills_it(stack, llm):
    gateway = stack.gateway_stub()
    llm.add(reply("", tool_call("shell", {"command": "sleep 47.5 && touch after.txt"})))
    request = gateway_pb2.ChatRequest(session_id="cancel-me", message="long job")
    call = gateway.Chat(request, timeout=60)
    events = []

    async def read_all():
        async for event in call:
            events.append(event)

    reader = asyncio.create_task(read_all())
    await wait_until(lambda: "tool_call" in kinds(events))
    await wait_until(lambda: processes_running("sleep 47.5"))

    reply_ = await gateway.Cancel(gateway_pb2.CancelRequest(session_id="cancel-me"), timeout=10)
    assert reply_.cancelled and reply_.run_id == events[0].run_id
    await asyncio.wait_for(reader, 15)

    assert kinds(events)[-1] == "run_finished"
    assert events[-1].run_finished.stop_reason == "cancelled"
    await wait_until(lambda: not processes_running("sleep 47.5"))
    assert not (stack.settings.home / "workspaces" / "cancel-me" / "after.txt").exists()

    # The session is free again, and cancelling an idle session is a no-op.
    idle = await gateway.Cancel(gateway_pb2.CancelRequest(session_id="cancel-me"), timeout=10)
    assert not idle.cancelled
    llm.add(reply("back"))
    assert of_kind(await chat(gateway, "cancel-me", "again"), "run_finished")[0].final_text == "back"


async def test_tool_arguments_reach_the_tool_as_the_model_wrote_them(stack, llm):
    content = "line one\nünïcode ✓ \"quoted\"\n"
    llm.add(
        reply("", tool_call("write_file", {"path": "notes/a.txt", "content": content}), chunk_chars=3),
        reply("", tool_call("read_file", {"path": "notes/a.txt"})),
        reply("done"),
    )
    events = await chat(stack.gateway_stub(), "args", "write then read")
    results = [r.result for r in of_kind(events, "tool_result")]
    assert [r.is_error for r in results] == [False, False]
    assert content in results[1].output
    assert (stack.settings.home / "workspaces" / "args" / "notes" / "a.txt").read_text() == content
    arguments = json.loads(of_kind(events, "tool_call")[0].arguments_json)
    assert arguments == {"path": "notes/a.txt", "content": content}


async def test_a_session_namespace_is_accepted_by_every_service(stack, llm):
    gateway = stack.gateway_stub()
    created = await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id="ns", namespace="team:infra"), timeout=10)
    assert created.namespace == "team:infra"
    llm.add(reply("ok"))
    events = await chat(gateway, "ns", "hi")
    assert of_kind(events, "error") == [] and of_kind(events, "run_finished")[0].final_text == "ok"
    err = await rpc_error(gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id="ns2", namespace="bad ns"), timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "namespace" in err.details()
