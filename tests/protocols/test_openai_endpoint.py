"""The OpenAI-compatible endpoint (docs/agents.md), reached with the official `openai` SDK,
unmodified, over real HTTP in front of the whole stack: a user's token is the API key, the
namespace's agents are its models, and a completion streams a turn of the named agent — whose own
(sandboxed) tool call stays inside the turn and shows only as progress. A token of another tenant
cannot reach that agent. Two tenants from a policy file of service accounts (tests/e2e/test_tenants.py)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from agentmesh.tenancy import token_digest
from agentmesh.v1 import agents_pb2, common_pb2, gateway_pb2_grpc, sessions_pb2
from tests.support.llm_server import reply, tool_call
from tests.support.stack import Stack

TOKENS = {"a-admin": "tok-a-admin-0123456789", "a-member": "tok-a-member-0123456789",
          "b-member": "tok-b-member-0123456789"}


def _policy() -> str:
    accounts = [{"name": name, "token_sha256": token_digest(token), "tenant": "acme" if name[0] == "a" else "beta",
                 "role": name.split("-")[1]} for name, token in TOKENS.items()]
    return json.dumps({"tenants": {"acme": {"namespaces": ["acme"]}, "beta": {"namespaces": ["beta"]}},
                       "service_accounts": accounts})


@pytest.fixture
async def stack(tmp_path, llm):
    policy = tmp_path / "policy.json"
    policy.write_text(_policy())
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env={"AGENTMESH_AUTH_POLICY": str(policy)}) as running:
        gateway = gateway_pb2_grpc.GatewayStub(running.user_channel("gateway"))
        await gateway.CreateAgent(agents_pb2.CreateAgentRequest(namespace="acme", spec=agents_pb2.AgentSpec(
            name="shell-runner", description="Runs shell commands in a sandbox.",
            instructions="You are SHELL-RUNNER; run what is asked in the shell.",
            tools=common_pb2.ToolPolicy(allow=["shell"]))),
            metadata=(("authorization", f"Bearer {TOKENS['a-admin']}"),), timeout=30)
        yield running


def client(stack, who: str, namespace: str = "acme") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{stack.http_url}/openai/{namespace}/v1", api_key=TOKENS[who],
                              max_retries=0)


async def test_the_sdk_lists_the_agents_and_streams_an_answer_from_one_that_ran_a_sandboxed_tool(stack, llm):
    member = client(stack, "a-member")
    models = await member.models.list()
    assert [m.id for m in models.data] == ["code", "explore", "plan", "shell-runner"]

    llm.add(reply("", tool_call("shell", {"command": "echo from-the-jail"})), reply("The shell said from-the-jail."))
    stream = await member.chat.completions.create(
        model="shell-runner", messages=[{"role": "user", "content": "run the echo"}], stream=True,
        user="alice", stream_options={"include_usage": True})
    content, progress, finish, usage = "", [], None, None
    async for chunk in stream:
        extra = (chunk.model_extra or {}).get("agentmesh")
        if extra:
            progress.append(extra)
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            assert not choice.delta.tool_calls  # the agent's tools are not the client's to run
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert content == "The shell said from-the-jail." and finish == "stop"
    assert [(p["event"], p["name"]) for p in progress] == [("tool_call", "shell"), ("tool_result", "shell")]
    assert not progress[1]["is_error"]
    assert usage is not None and usage.total_tokens > 0
    # The agent's instructions and tool policy reached the model; the command ran in the sandbox.
    first, second = llm.requests
    assert "You are SHELL-RUNNER" in first.messages[0]["content"]
    assert [t["function"]["name"] for t in first.body["tools"]] == ["shell"]
    assert any("from-the-jail" in str(m.get("content")) for m in second.messages if m.get("role") == "tool")

    # The `user` field maps to one session, which records the agent it ran.
    llm.add(reply("again"))
    answer = await member.chat.completions.create(
        model="shell-runner", messages=[{"role": "user", "content": "once more"}], user="alice")
    assert answer.choices[0].message.content == "again"
    session_id = answer.model_extra["agentmesh"]["session_id"]
    assert len(llm.requests[-1].messages) > 3  # the earlier turn is in the session's history
    gateway = gateway_pb2_grpc.GatewayStub(stack.user_channel("gateway"))
    session = await gateway.GetSession(sessions_pb2.GetSessionRequest(session_id=session_id),
                                       metadata=(("authorization", f"Bearer {TOKENS['a-member']}"),), timeout=10)
    assert (session.namespace, session.agent, session.agent_version) == ("acme", "shell-runner", 1)


async def test_a_sub_agent_surfaces_as_progress_with_its_usage(stack, llm):
    gateway = gateway_pb2_grpc.GatewayStub(stack.user_channel("gateway"))
    await gateway.CreateAgent(agents_pb2.CreateAgentRequest(namespace="acme", spec=agents_pb2.AgentSpec(
        name="lead", instructions="You delegate.", sub_agents=["explore"])),
        metadata=(("authorization", f"Bearer {TOKENS['a-admin']}"),), timeout=30)
    llm.add(reply("", tool_call("agent_explore", {"task": "look around"})), reply("nothing here"), reply("Empty."))
    answer = await client(stack, "a-member").chat.completions.create(
        model="lead", messages=[{"role": "user", "content": "what is there?"}])
    assert answer.choices[0].message.content == "Empty." and not answer.choices[0].message.tool_calls
    progress = answer.model_extra["agentmesh"]["progress"]
    assert [(p["event"], p.get("state"), p["name"]) for p in progress] == [
        ("tool_call", None, "agent_explore"), ("subagent", "started", "explore"), ("subagent", "finished", "explore"),
        ("tool_result", None, "agent_explore")]
    assert progress[1]["child_session_id"] == progress[2]["child_session_id"]
    assert progress[2]["stop_reason"] == "completed" and progress[2]["total_tokens"] > 0


async def test_a_token_of_another_tenant_cannot_reach_the_agent(stack, llm):
    outsider = client(stack, "b-member")
    # The namespace is another tenant's: refused as every namespace-scoped call of the gateway is.
    with pytest.raises((openai.NotFoundError, openai.PermissionDeniedError)):
        await outsider.chat.completions.create(model="shell-runner", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises((openai.NotFoundError, openai.PermissionDeniedError)):
        await outsider.models.list()
    # Its own namespace has only the built-ins: no shell-runner there either.
    own = await client(stack, "b-member", "beta").models.list()
    assert [m.id for m in own.data] == ["code", "explore", "plan"]
    with pytest.raises(openai.NotFoundError):
        await client(stack, "b-member", "beta").chat.completions.create(
            model="shell-runner", messages=[{"role": "user", "content": "hi"}])
    # A key that is no token at all.
    bad = openai.AsyncOpenAI(base_url=f"{stack.http_url}/openai/acme/v1", api_key="not-a-token", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        await bad.models.list()
    assert not llm.requests


async def test_a_request_without_a_user_message_is_a_400_naming_the_field(stack, llm):
    async with httpx.AsyncClient() as http:
        answer = await http.post(f"{stack.http_url}/openai/acme/v1/chat/completions",
                                 headers={"Authorization": f"Bearer {TOKENS['a-member']}"},
                                 json={"model": "shell-runner", "messages": [{"role": "system", "content": "x"}]})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] == "INVALID_ARGUMENT" and error["metadata"]["field"] == "messages"
    assert not llm.requests
