"""Remote A2A agents as tools: an agentmesh agent calls a second agentmesh stack's agent over A2A
(the a2a-sdk client in the tools service, the a2a-sdk server in the other gateway), and the
depth limit stops agents that call each other."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlparse

import grpc
import pytest

from agentmesh.internal.v1 import tools_service_pb2
from agentmesh.v1 import gateway_pb2, sessions_pb2, tools_pb2
from tests.protocols.conftest import TOKEN
from tests.support.llm_server import ScriptedLLMServer, reply, tool_call
from tests.support.stack import Stack
from tests.support.turns import collect, of_kind

REMOTE_TOKEN = "remote-stack-token-0123456789"


@pytest.fixture
def remote_llm():
    with ScriptedLLMServer() as server:
        yield server


@pytest.fixture
async def remote(tmp_path, remote_llm):
    """The second stack: its agent is reached only over A2A, with its own token."""
    env = {"AGENTMESH_AUTH_TOKENS": REMOTE_TOKEN, "AGENTMESH_AGENT_SYSTEM_PROMPT": "You are the remote agent."}
    async with Stack(tmp_path / "remote", llm_base_url=remote_llm.base_url, env=env) as running:
        yield running


def servers_file(tmp_path, remote: Stack) -> dict:
    path = tmp_path / "servers.json"
    path.write_text(json.dumps({"a2aAgents": {"helper": {
        "url": remote.http_url, "headers": {"Authorization": "Bearer ${AGENTMESH_MCP_SECRET_HELPER}"}}}}))
    port = urlparse(remote.http_url).port
    return {"AGENTMESH_MCP_SERVERS": str(path), "AGENTMESH_MCP_SECRET_HELPER": REMOTE_TOKEN,
            "AGENTMESH_TOOLS_WEB_ALLOW": f"127.0.0.1:{port}", "AGENTMESH_AUTH_TOKENS": TOKEN}


async def test_an_agent_calls_another_stacks_agent_as_a_tool(tmp_path, llm, remote, remote_llm):
    async with Stack(tmp_path / "local", llm_base_url=llm.base_url, env=servers_file(tmp_path, remote)) as local:
        metadata = (("authorization", f"Bearer {TOKEN}"),)
        listed = {t.name: t for t in (await local.gateway_stub().ListTools(tools_pb2.ListToolsRequest(), metadata=metadata)).tools}
        assert "a2a__helper" in listed
        assert listed["a2a__helper"].description.startswith("[A2A agent helper] An agentmesh agent")
        assert set(json.loads(listed["a2a__helper"].parameters_json_schema)["properties"]) == {"message", "context_id"}

        llm.add(reply("", tool_call("a2a__helper", {"message": "What is 6 times 7?"}, id="c1")), reply("The helper says 42."))
        remote_llm.add(reply("42"))
        events = await collect(local.gateway_stub().Chat(
            gateway_pb2.ChatRequest(session_id="asker", message="ask the helper"), metadata=metadata, timeout=120))

        result = of_kind(events, "tool_result")[0].result
        assert not result.is_error, result.output
        assert result.output.startswith("42\n") and "context_id a2a-" in result.output
        assert result.data["a2a_agent"] == "helper" and result.data["state"] == "completed"
        assert of_kind(events, "run_finished")[0].final_text == "The helper says 42."
        # The remote model was asked the question; the local model read the remote answer.
        assert remote_llm.requests[0].messages[-1]["content"] == "What is 6 times 7?"
        assert any(m.get("role") == "tool" and m["content"].startswith("42") for m in llm.requests[-1].messages)

        # On the remote stack the conversation is a session one hop deep.
        context_id = result.data["context_id"]
        session = await remote.gateway_stub().GetSession(sessions_pb2.GetSessionRequest(session_id=context_id),
                                                         metadata=(("authorization", f"Bearer {REMOTE_TOKEN}"),))
        assert session.labels["agentmesh.a2a.depth"] == "1"


async def test_cancelling_the_turn_cancels_the_remote_task(tmp_path, llm, remote, remote_llm):
    async with Stack(tmp_path / "local", llm_base_url=llm.base_url, env=servers_file(tmp_path, remote)) as local:
        metadata = (("authorization", f"Bearer {TOKEN}"),)
        llm.add(reply("", tool_call("a2a__helper", {"message": "take your time"}, id="c1")))
        remote_llm.add(reply("too late", delay_s=30))
        stub = local.gateway_stub()
        turn = asyncio.ensure_future(collect(stub.Chat(gateway_pb2.ChatRequest(session_id="c", message="go"),
                                                       metadata=metadata, timeout=120)))
        await asyncio.to_thread(remote_llm.wait_for_requests, 1, 30)  # the remote turn is running
        cancelled = await stub.Cancel(gateway_pb2.CancelRequest(session_id="c"), metadata=metadata)
        assert cancelled.cancelled
        events = await asyncio.wait_for(turn, 30)
        assert of_kind(events, "run_finished")[0].stop_reason == "cancelled"

        # The remote turn was cancelled too: its session takes a new turn at once (a running
        # turn would refuse it for the 30 s the remote model takes).
        remote_stub = remote.gateway_stub()
        remote_meta = (("authorization", f"Bearer {REMOTE_TOKEN}"),)
        listed = await remote_stub.ListSessions(sessions_pb2.ListSessionsRequest(), metadata=remote_meta)
        [remote_id] = [s.session_id for s in listed.sessions]
        remote_llm.add(reply("next"))
        for _ in range(50):
            try:
                again = await collect(remote_stub.Chat(gateway_pb2.ChatRequest(session_id=remote_id, message="next"),
                                                       metadata=remote_meta, timeout=60))
                break
            except grpc.aio.AioRpcError as err:
                assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
                await asyncio.sleep(0.1)
        assert of_kind(again, "run_finished")[0].final_text == "next"


async def test_agents_calling_each_other_stop_at_the_depth_limit(tmp_path, llm, remote_llm):
    env = {"AGENTMESH_AUTH_TOKENS": REMOTE_TOKEN, "AGENTMESH_GATEWAY_A2A_MAX_DEPTH": "0"}
    async with Stack(tmp_path / "remote", llm_base_url=remote_llm.base_url, env=env) as remote:
        async with Stack(tmp_path / "local", llm_base_url=llm.base_url, env=servers_file(tmp_path, remote)) as local:
            llm.add(reply("", tool_call("a2a__helper", {"message": "hi"}, id="c1")), reply("It refused."))
            events = await collect(local.gateway_stub().Chat(
                gateway_pb2.ChatRequest(session_id="deep", message="ask"),
                metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=120))
    result = of_kind(events, "tool_result")[0].result
    assert result.is_error and result.error_kind == "depth_limit"
    assert "1 A2A hops deep" in result.output and "AGENTMESH_GATEWAY_A2A_MAX_DEPTH" in result.output
    assert not remote_llm.requests  # no turn ran there


async def test_an_agent_the_egress_policy_refuses_is_unavailable_not_a_crash(tmp_path, remote):
    env = servers_file(tmp_path, remote)
    del env["AGENTMESH_TOOLS_WEB_ALLOW"]
    async with Stack(tmp_path / "local", env=env, services=("memory", "tools")) as local:
        tools = local.tools_stub()
        listed = [t.name for t in (await tools.ListTools(tools_pb2.ListToolsRequest())).tools]
        assert "a2a__helper" not in listed  # not offered to the model while it cannot be reached
        called = await tools.Execute(tools_service_pb2.ExecuteRequest(session_id="s", call_id="c1", name="a2a__helper",
                                                              arguments_json='{"message": "hi"}'), timeout=60)
    result = called.result
    assert result.is_error and result.error_kind == "unavailable" and "egress policy refuses" in result.output


@pytest.mark.parametrize(("entry", "says"), [
    ({"url": "ftp://x"}, "is not an http(s) URL"),
    ({"url": "https://x", "token": "t"}, "unknown key(s) token"),
    ({"url": "https://x", "headers": {"A": "${HOME}"}}, "must name a variable starting with AGENTMESH_MCP_SECRET_"),
])
def test_bad_a2a_agent_entries_stop_the_service_with_a_sentence(tmp_path, entry, says):
    from agentmesh.config import ConfigError
    from agentmesh.tools.mcp.config import load_agents

    path = tmp_path / "servers.json"
    path.write_text(json.dumps({"a2aAgents": {"helper": entry}}))
    with pytest.raises(ConfigError, match="A2A agent 'helper'") as raised:
        load_agents(str(path), {})
    assert says in str(raised.value)
