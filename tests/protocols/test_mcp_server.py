"""The gateway as an MCP server: the `mcp` SDK's client calls `ask_agent` at /mcp over
streamable HTTP, and the turn runs through the whole stack."""

from __future__ import annotations

import httpx
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from agentmesh.v1 import sessions_pb2
from tests.protocols.conftest import TOKEN
from tests.support.llm_server import reply, tool_call

AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def call_ask_agent(url: str, arguments: dict, headers: dict = AUTH):
    progress: list[str] = []

    async def on_progress(value, total, message):
        progress.append(message or "")

    async with httpx2.AsyncClient(headers=headers, timeout=60) as http, \
            streamable_http_client(url, http_client=http) as (read, write, *_):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = await session.list_tools()
            result = await session.call_tool("ask_agent", arguments, progress_callback=on_progress)
    return tools, result, progress


async def test_the_mcp_client_asks_the_agent_and_continues_the_session(stack, llm):
    llm.add(reply("", tool_call("write_file", {"path": "a.txt", "content": "x"}, id="c1")), reply("Wrote a.txt."))
    tools, result, progress = await call_ask_agent(f"{stack.http_url}/mcp", {"message": "write a.txt"})

    ask = next(t for t in tools.tools if t.name == "ask_agent")
    assert set(ask.input_schema["properties"]) == {"message", "session", "agent"} and ask.input_schema["required"] == ["message"]
    assert not result.is_error, result.content
    answer = result.structured_content
    assert answer["reply"] == "Wrote a.txt." and answer["stop_reason"] == "completed"
    assert progress == ["calling write_file"]

    # The session it ran in carries on with the next call.
    llm.add(reply("Still here."))
    _, again, _ = await call_ask_agent(f"{stack.http_url}/mcp", {"message": "and now?", "session": answer["session"]})
    assert again.structured_content["reply"] == "Still here."
    assert again.structured_content["session"] == answer["session"]
    transcript = await stack.gateway_stub().GetTranscript(
        sessions_pb2.GetTranscriptRequest(session_id=answer["session"]), metadata=(("authorization", AUTH["Authorization"]),))
    assert [m.content for m in transcript.messages if m.role == "user"] == ["write a.txt", "and now?"]


async def test_a_bad_session_id_is_a_tool_error_the_client_reads(stack):
    _, result, _ = await call_ask_agent(f"{stack.http_url}/mcp", {"message": "hi", "session": "../etc"})
    assert result.is_error and "malformed" in result.content[0].text


async def test_the_mcp_endpoint_needs_the_gateways_token(stack):
    async with httpx.AsyncClient(timeout=30) as http:
        refused = await http.post(f"{stack.http_url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "initialize"},
                                  headers={"Accept": "application/json, text/event-stream"})
    assert refused.status_code == 401 and refused.headers["WWW-Authenticate"] == "Bearer"
    with pytest.raises(Exception):  # noqa: B017 - the SDK's client fails to connect, whatever its exception type
        await call_ask_agent(f"{stack.http_url}/mcp", {"message": "hi"}, headers={"Authorization": "Bearer nope"})


async def test_ask_agent_runs_the_named_agent_it_is_given(stack, llm):
    from agentmesh.v1 import agents_pb2

    await stack.gateway_stub().CreateAgent(agents_pb2.CreateAgentRequest(namespace="default", spec=agents_pb2.AgentSpec(
        name="triager", description="Triages issues.", instructions="You are TRIAGER; sort issues.")),
        metadata=(("authorization", AUTH["Authorization"]),))
    llm.add(reply("Sorted."))
    _, result, _ = await call_ask_agent(f"{stack.http_url}/mcp", {"message": "sort these", "agent": "triager"})
    assert not result.is_error, result.content
    assert result.structured_content["reply"] == "Sorted."
    (request,) = llm.requests
    assert "You are TRIAGER" in request.messages[0]["content"]
    session = await stack.gateway_stub().GetSession(
        sessions_pb2.GetSessionRequest(session_id=result.structured_content["session"]),
        metadata=(("authorization", AUTH["Authorization"]),))
    assert (session.agent, session.agent_version) == ("triager", 1)

    # An agent the namespace does not have is a tool error naming it; no model call is made.
    _, unknown, _ = await call_ask_agent(f"{stack.http_url}/mcp", {"message": "hi", "agent": "nobody"})
    assert unknown.is_error and "nobody" in unknown.content[0].text
    assert len(llm.requests) == 1
