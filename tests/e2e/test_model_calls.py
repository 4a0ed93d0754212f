"""Model calls' payloads for the dev panel, end to end: with AGENTMESH_AGENT_RECORD_MODEL_CALLS on,
each call's request (messages, tools, parameters) and response (text, tool calls, usage) are
readable through `Gateway.ListModelCalls` and its HTTP route, with no key in them; another
tenant gets what a missing session gets; deleting the session removes them. Off (the default),
nothing is recorded and a turn makes no RecordModelCalls call (read from its trace). On, a
call's record rides the append of the step it produced when that comes at once (as usage does)."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import httpx
import pytest

from agentmesh.v1 import gateway_pb2, sessions_pb2
from tests.e2e.conftest import collect, of_kind, rpc_error
from tests.e2e.test_tenants import TOKENS, _policy, auth
from tests.support.llm_server import reply, tool_call
from tests.support.stack import Stack, stack_env
from tests.support.timing import polling

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


async def test_off_by_default_nothing_is_recorded_and_no_call_is_made(stack, llm):
    gateway = stack.gateway_stub()
    llm.add(reply("plain"))
    events = await collect(gateway.Chat(gateway_pb2.ChatRequest(session_id="quiet", message="hi"), timeout=60))
    trace_id = of_kind(events, "run_finished")[0].trace_id
    calls = await gateway.ListModelCalls(sessions_pb2.ListModelCallsRequest(session_id="quiet"), timeout=10)
    assert list(calls.calls) == []
    async for _ in polling(0.1):
        try:
            trace = await gateway.GetTrace(gateway_pb2.GetTraceRequest(trace_id=trace_id), timeout=10)
        except grpc.aio.AioRpcError as err:
            assert err.code() == grpc.StatusCode.NOT_FOUND
            continue
        names = [s.name for s in trace.spans]
        # Wait for the turn's memory writes to be exported: the transcript append is one.
        if any("AppendMessages" in n or "AppendStream" in n or "CarriedCalls" in n for n in names) and \
                any(n.startswith("chat ") for n in names):
            break
    assert not [n for n in names if "ModelCalls" in n]
