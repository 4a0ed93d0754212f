"""Model calls' payloads for the dev panel, end to end: with AGENTMESH_AGENT_RECORD_MODEL_CALLS on,
each call's request (messages, tools, parameters) and response (text, tool calls, usage) are
readable through `Gateway.ListModelCalls` and its HTTP route, with no key in them; another
tenant gets what a missing session gets; deleting the session removes them. Off (the default),
nothing is recorded; on or off, a turn makes the same calls to memory (read from its trace): a
call's record rides the append of the step it produced (as usage records do)."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import httpx
import pytest

from agentmesh.v1 import gateway_pb2, sessions_pb2
from tests.e2e.conftest import collect, of_kind, rpc_error
from tests.e2e.test_tenants import TOKENS, _policy, auth
from tests.e2e.test_turn_start import server_calls
from tests.support.llm_server import reply, tool_call
from tests.support.stack import Stack, stack_env

KEY = stack_env(Path("/nonexistent"))["AGENTMESH_LLM_API_KEY"]


@pytest.fixture
async def recording(tmp_path: Path, llm):
    policy = tmp_path / "policy.json"
    policy.write_text(_policy())
    env = {"AGENTMESH_AUTH_POLICY": str(policy), "AGENTMESH_AGENT_RECORD_MODEL_CALLS": "true",
           "AGENTMESH_AGENT_RECALL_K": "0"}
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=env) as stack:
        yield stack


async def _turn(gateway, session_id: str, message: str, who: str) -> None:
    events = await collect(gateway.Chat(gateway_pb2.ChatRequest(session_id=session_id, message=message),
                                        metadata=auth(who), timeout=60))
    assert of_kind(events, "run_finished")


async def test_recorded_calls_are_readable_keyless_and_tenant_scoped(recording, llm):
    gateway = recording.gateway_stub()
    llm.add(reply("", tool_call("memory_search", {"query": "launch"})),
            reply("the answer", usage=(700, 70)))
    # The user pastes the deployment's model key and a bearer header: neither is recorded.
    await _turn(gateway, "b-dev", f"my key is {KEY} and Authorization: Bearer abcdefgh12345678", "b-member")

    calls = (await gateway.ListModelCalls(sessions_pb2.ListModelCallsRequest(session_id="b-dev"),
                                          metadata=auth("b-member"), timeout=10)).calls
    assert len(calls) == 2 and {c.run_id for c in calls} == {calls[0].run_id} and calls[0].run_id
    first, second = (json.loads(c.request_json) for c in calls)
    assert first["messages"][-1]["role"] == "user" and "my key is [redacted]" in first["messages"][-1]["content"]
    assert "memory_search" in [t["name"] for t in first["tools"]] and "allow_tools" in first["parameters"]
    assert json.loads(calls[0].response_json)["tool_calls"][0]["name"] == "memory_search"
    assert second["messages"][-1]["role"] == "tool"
    answered = json.loads(calls[1].response_json)
    assert answered["text"] == "the answer" and answered["usage"]["input_tokens"] == 700
    assert not calls[0].truncated and calls[0].model == "test-model"
    # One run's calls only.
    only = await gateway.ListModelCalls(sessions_pb2.ListModelCallsRequest(session_id="b-dev", run_id="other-run"),
                                        metadata=auth("b-member"), timeout=10)
    assert list(only.calls) == []

    async with httpx.AsyncClient(base_url=recording.http_url, timeout=30) as http:
        mine = await http.get("/v1/sessions/b-dev/model_calls", headers={"Authorization": f"Bearer {TOKENS['b-member']}"})
        assert mine.status_code == 200, mine.text
        body = mine.text
        assert len(mine.json()["calls"]) == 2 and "the answer" in body
        assert KEY not in body and "abcdefgh12345678" not in body
        # Another tenant: what a session that does not exist gets.
        theirs = await http.get("/v1/sessions/b-dev/model_calls", headers={"Authorization": f"Bearer {TOKENS['a-admin']}"})
        assert theirs.status_code == 404 and "the answer" not in theirs.text
    err = await rpc_error(gateway.ListModelCalls(sessions_pb2.ListModelCallsRequest(session_id="b-dev"),
                                                 metadata=auth("a-admin")))
    assert err.code() == grpc.StatusCode.NOT_FOUND and err.details() == "session 'b-dev' does not exist"

    # Removed with the session.
    await gateway.DeleteSession(sessions_pb2.DeleteSessionRequest(session_id="b-dev"), metadata=auth("b-admin"))
    llm.add(reply("fresh"))
    await _turn(gateway, "b-dev", "again", "b-member")
    calls = (await gateway.ListModelCalls(sessions_pb2.ListModelCallsRequest(session_id="b-dev"),
                                          metadata=auth("b-member"), timeout=10)).calls
    assert [json.loads(c.response_json)["text"] for c in calls] == ["fresh"]


@pytest.mark.parametrize("record", [False, True], ids=["off", "on"])
async def test_recording_adds_no_call_to_memory(tmp_path, llm, record):
    """Off (the default) nothing is recorded; on, each call's record rides the append of the step
    it produced: a turn makes the same calls to memory either way, and no RecordModelCalls."""
    home = tmp_path / "home"
    # The step's append follows its model call at once, but on a loaded machine "at once" can pass
    # the 20 ms a record waits to be carried; what is asserted here is that it rides the append
    # when the append comes, so the hold is made long (as test_turn_start does).
    env = {"AGENTMESH_AGENT_USAGE_HOLD_S": "30"}
    if record:
        env["AGENTMESH_AGENT_RECORD_MODEL_CALLS"] = "true"
    async with Stack(home, llm_base_url=llm.base_url, env=env) as stack:
        gateway = stack.gateway_stub()
        llm.add(reply("", tool_call("shell", {"command": "true"}, id="c1")), reply("done"))
        events = await collect(gateway.Chat(gateway_pb2.ChatRequest(session_id="s1", message="go"), timeout=60))
        trace_id = of_kind(events, "run_finished")[0].trace_id
        calls = await gateway.ListModelCalls(sessions_pb2.ListModelCallsRequest(session_id="s1"), timeout=10)
        assert len(calls.calls) == (2 if record else 0)
    served = server_calls(home)[trace_id]  # the stack is stopped: every span exported
    assert "RecordModelCalls" not in served, served
    assert served.count("StartTurn") == 1 and served.count("AppendMessages") == 3, served


async def test_a_session_turned_on_records_its_calls_and_no_other_session_does(tmp_path, llm):
    """Without the deployment's setting, a session whose `record_model_calls` is on (UpdateSession
    with the field in the mask) has its calls recorded; another session's are not, and turned off
    again its next turn adds none."""
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env={"AGENTMESH_AGENT_RECALL_K": "0"}) as stack:
        gateway = stack.gateway_stub()
        for session_id in ("s-on", "s-off"):
            await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id=session_id), timeout=10)
        switched = await gateway.UpdateSession(sessions_pb2.UpdateSessionRequest(
            session_id="s-on", record_model_calls=True, update_mask=["record_model_calls"]), timeout=10)
        assert switched.record_model_calls
        # A change of another field leaves the switch as it is.
        kept = await gateway.UpdateSession(sessions_pb2.UpdateSessionRequest(
            session_id="s-on", permission_mode="auto", update_mask=["permission_mode"]), timeout=10)
        assert kept.record_model_calls and kept.permission_mode == "auto"

        async def turn(session_id: str, answer: str) -> None:
            llm.add(reply(answer))
            events = await collect(gateway.Chat(gateway_pb2.ChatRequest(session_id=session_id, message="hi"), timeout=60))
            assert of_kind(events, "run_finished")

        async def recorded(session_id: str) -> list[str]:
            calls = await gateway.ListModelCalls(sessions_pb2.ListModelCallsRequest(session_id=session_id), timeout=10)
            return [json.loads(c.response_json)["text"] for c in calls.calls]

        await turn("s-on", "recorded answer")
        await turn("s-off", "unrecorded answer")
        assert await recorded("s-on") == ["recorded answer"]
        assert await recorded("s-off") == []

        off = await gateway.UpdateSession(sessions_pb2.UpdateSessionRequest(
            session_id="s-on", update_mask=["record_model_calls"]), timeout=10)
        assert not off.record_model_calls
        await turn("s-on", "after it was turned off")
        assert await recorded("s-on") == ["recorded answer"]
