"""Named agents (docs/agents.md) over real gRPC, with scripted model servers that log each
request: two agents of one namespace send their own system prompt, model and tool list; a session
records the agent version it ran; an edit makes version 2 and a rollback to 1 brings 1's
instructions back; bad definitions are refused with a reason and a field, changing nothing."""

from __future__ import annotations

import json

import grpc
import httpx
import pytest
from google.protobuf import json_format

from agentmesh.rpc.errors import error_info_of
from agentmesh.v1 import agents_pb2, common_pb2, sessions_pb2, tools_pb2
from tests.e2e.conftest import chat, of_kind, rpc_error
from tests.support.llm_server import ScriptedLLMServer, reply, tool_call
from tests.support.stack import Stack


@pytest.fixture
def other():
    with ScriptedLLMServer() as server:
        yield server


@pytest.fixture
async def stack(tmp_path, llm, other):
    catalog = tmp_path / "models.yaml"
    catalog.write_text(f"""
models:
  - name: other
    base_url: {other.base_url}
    model: other-model
""")
    env = {"AGENTMESH_MODELS": str(catalog), "AGENTMESH_AUDIT_LOG": str(tmp_path / "audit.jsonl")}
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=env) as running:
        yield running


def spec(name, instructions, **fields):
    return agents_pb2.AgentSpec(name=name, description=f"{name} agent", instructions=instructions, **fields)


def tool_names(request):
    return sorted(t["function"]["name"] for t in request.body.get("tools", []))


async def test_two_agents_send_their_own_prompt_model_and_tools_and_the_session_records_the_version(
        stack, llm, other):
    gateway = stack.gateway_stub()
    reader = await gateway.CreateAgent(agents_pb2.CreateAgentRequest(namespace="default", spec=spec(
        "reader", "You are READER; you only read.", tools=common_pb2.ToolPolicy(allow=["read_file", "grep"]))))
    assert (reader.version, reader.current_version, reader.builtin) == (1, 1, False)
    await gateway.CreateAgent(agents_pb2.CreateAgentRequest(namespace="default", spec=spec(
        "runner", "You are RUNNER; you run commands.", model="other", temperature=0.3,
        tools=common_pb2.ToolPolicy(deny=["write_file"]))))

    llm.add(reply("read it"))
    other.add(reply("ran it"))
    assert of_kind(await chat(gateway, "s-reader", "hi", agent="reader"), "run_finished")[0].final_text == "read it"
    assert of_kind(await chat(gateway, "s-runner", "hi", agent="runner"), "run_finished")[0].final_text == "ran it"

    (to_reader,) = llm.requests
    (to_runner,) = other.requests
    assert "You are READER" in to_reader.messages[0]["content"]
    assert "You are RUNNER" in to_runner.messages[0]["content"]
    assert to_reader.body["model"] == "test-model" and to_runner.body["model"] == "other-model"
    assert to_runner.body["temperature"] == 0.3 and "temperature" not in to_reader.body
    assert tool_names(to_reader) == ["grep", "read_file"]
    runner_tools = tool_names(to_runner)
    assert "shell" in runner_tools and "write_file" not in runner_tools

    session = await gateway.GetSession(sessions_pb2.GetSessionRequest(session_id="s-reader"))
    assert (session.agent, session.agent_version) == ("reader", 1)
    listed = await gateway.ListAgents(agents_pb2.ListAgentsRequest(namespace="default"))
    assert [a.spec.name for a in listed.agents] == ["code", "explore", "plan", "reader", "runner"]
    assert [a.builtin for a in listed.agents] == [True, True, True, False, False]


async def test_an_edit_makes_version_two_and_a_rollback_brings_version_one_back(stack, llm):
    gateway = stack.gateway_stub()
    await gateway.CreateAgent(agents_pb2.CreateAgentRequest(spec=spec("helper", "FIRST instructions")))
    edited = await gateway.UpdateAgent(agents_pb2.UpdateAgentRequest(spec=spec("helper", "SECOND instructions")))
    assert (edited.version, edited.current_version) == (2, 2)

    llm.add(reply("two"), reply("one"))
    await chat(gateway, "s", "hi", agent="helper")
    assert "SECOND instructions" in llm.requests[-1].messages[0]["content"]
    session = await gateway.GetSession(sessions_pb2.GetSessionRequest(session_id="s"))
    assert session.agent_version == 2

    # Rollback appends: version 3 is a copy of version 1, and the name points at it.
    rolled = await gateway.RollbackAgent(agents_pb2.RollbackAgentRequest(name="helper", version=1))
    assert (rolled.version, rolled.rolled_back_from, rolled.spec.instructions) == (3, 1, "FIRST instructions")
    await chat(gateway, "s", "again", agent="helper")
    assert "FIRST instructions" in llm.requests[-1].messages[0]["content"]
    session = await gateway.GetSession(sessions_pb2.GetSessionRequest(session_id="s"))
    assert (session.agent, session.agent_version) == ("helper", 3)

    versions = await gateway.ListAgentVersions(agents_pb2.ListAgentVersionsRequest(name="helper"))
    assert [(v.version, v.spec.instructions) for v in versions.versions] == [
        (1, "FIRST instructions"), (2, "SECOND instructions"), (3, "FIRST instructions")]
    pinned = await gateway.GetAgent(agents_pb2.GetAgentRequest(name="helper@2"))
    assert (pinned.version, pinned.current_version) == (2, 3)
    removed = await gateway.DeleteAgent(agents_pb2.DeleteAgentRequest(name="helper"))
    assert removed.removed_versions == 3
    err = await rpc_error(gateway.GetAgent(agents_pb2.GetAgentRequest(name="helper")))
    assert err.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize(("bad", "field"), [
    (spec("Bad Name", "x"), "spec.name"),
    (spec("ok", ""), "spec.instructions"),
    (spec("ok", "x", temperature=3.0), "spec.temperature"),
    (spec("ok", "x", permission_mode="sometimes"), "spec.permission_mode"),
    (spec("ok", "x", sub_agents=["ok"]), "spec.sub_agents"),
])
async def test_a_bad_definition_is_invalid_argument_naming_the_field_and_changes_nothing(stack, bad, field):
    gateway = stack.gateway_stub()
    err = await rpc_error(gateway.CreateAgent(agents_pb2.CreateAgentRequest(spec=bad)))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    info = error_info_of(err)
    assert info is not None and info.reason == "INVALID_ARGUMENT" and info.metadata["field"] == field
    listed = await gateway.ListAgents(agents_pb2.ListAgentsRequest())
    assert [a.spec.name for a in listed.agents] == ["code", "explore", "plan"]


async def test_a_turn_naming_an_unknown_agent_is_refused_with_nothing_written(stack, llm):
    gateway = stack.gateway_stub()
    err = await rpc_error(chat(gateway, "s", "hi", agent="nobody"))
    assert err.code() == grpc.StatusCode.NOT_FOUND and "nobody" in err.details()
    err = await rpc_error(chat(gateway, "s", "hi", agent="Not A Name@x"))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info_of(err).metadata["field"] == "options.agent"
    assert not llm.requests
    # The refused turns stored nothing, not even the session.
    err = await rpc_error(gateway.GetSession(sessions_pb2.GetSessionRequest(session_id="s")))
    assert err.code() == grpc.StatusCode.NOT_FOUND


async def test_a_parent_agent_delegates_to_the_builtin_explore_which_cannot_write_files(stack, llm):
    gateway = stack.gateway_stub()
    await gateway.CreateAgent(agents_pb2.CreateAgentRequest(spec=spec(
        "lead", "You are LEAD; you delegate.", sub_agents=["explore"])))
    llm.add(
        reply("", tool_call("agent_explore", {"task": "write notes.txt saying hi"})),  # the parent
        reply("", tool_call("write_file", {"path": "notes.txt", "content": "hi"})),  # explore tries anyway
        reply("I cannot write files; I only read."),  # explore's answer
        reply("explore could not write it"),  # the parent's
        reply("", tool_call("delegate_task", {"task": "change the code", "agent": "code"})),
        reply("refused, as expected"),
    )
    events = await chat(gateway, "s", "take notes", agent="lead")
    assert of_kind(events, "run_finished")[0].final_text == "explore could not write it"
    to_parent, to_explore, _, _ = llm.requests[:4]
    offered = {t["function"]["name"]: t["function"]["description"] for t in to_parent.body["tools"]}
    assert "read-only" in offered["agent_explore"] and "delegate_task" in offered
    assert "You are LEAD" in to_parent.messages[0]["content"]
    # The child runs explore's instructions, with explore's read-only tools only.
    assert "You explore a workspace" in to_explore.messages[0]["content"]
    assert tool_names(to_explore) == ["glob", "grep", "list_dir", "read_file"]
    statuses = [e.message for e in of_kind(events, "status")]
    assert any("runs agent explore (version 0)" in s for s in statuses), statuses
    assert any("write_file failed" in s for s in statuses), statuses
    (result,) = [e for e in of_kind(events, "tool_result") if e.result.name == "agent_explore"]
    assert not result.result.is_error and "only read" in result.result.output
    # The sub-agent's end, with its usage and the agent version it ran, is its tool result's data.
    data = json_format.MessageToDict(result.result.data)
    assert (data["agent"], data["agent_version"], data["iterations"]) == ("explore", 0, 2)
    assert data["input_tokens"] > 0 and data["output_tokens"] > 0
    # ...and events of its own on the parent's stream: started when its session is open, then finished.
    started, finished = of_kind(events, "subagent")
    call_id = of_kind(events, "tool_call")[0].call_id
    for event in (started, finished):
        assert (event.call_id, event.index, event.depth) == (call_id, 1, 1)
        assert (event.agent, event.agent_version, event.session_id) == ("explore", 0, data["session_id"])
        assert event.task == "write notes.txt saying hi" and event.run_id
    assert (started.state, started.usage.total_tokens) == ("started", 0)
    assert (finished.state, finished.stop_reason, finished.iterations) == ("finished", "completed", 2)
    assert (finished.usage.input_tokens, finished.usage.output_tokens) == (data["input_tokens"], data["output_tokens"])
    # Both between the parent's tool_call and tool_result of that call.
    order = [e.WhichOneof("payload") for e in events if e.WhichOneof("payload") in ("tool_call", "subagent")
             or (e.WhichOneof("payload") == "tool_result" and e.tool_result.result.call_id == call_id)]
    assert order[:4] == ["tool_call", "subagent", "subagent", "tool_result"]
    # Its write never reached the workspace: there is no such file.
    err = await rpc_error(gateway.ReadWorkspaceFile(tools_pb2.ReadWorkspaceFileRequest(session_id="s",
                                                                                       path="notes.txt")))
    assert err.code() == grpc.StatusCode.NOT_FOUND

    # A named parent delegates only to the agents it lists.
    events = await chat(gateway, "s", "now change the code", agent="lead")
    (refused,) = [e for e in of_kind(events, "tool_result") if e.result.name == "delegate_task"]
    assert refused.result.is_error and "may delegate only to explore" in refused.result.output



async def test_the_http_api_defines_edits_and_rolls_back_and_each_change_is_audited(stack, tmp_path):
    base = f"{stack.http_url}/v1/namespaces/team-h/agents"
    async with httpx.AsyncClient() as http:
        made = await http.post(base, json={"spec": {"name": "web", "instructions": "ONE", "sub_agents": ["explore"],
                                                    "max_steps": 5}})
        assert made.status_code == 200, made.text
        assert made.json()["version"] == 1
        edited = await http.put(base, json={"spec": {"name": "web", "instructions": "TWO"}})
        assert edited.json()["version"] == 2
        rolled = await http.post(f"{base}/web/rollback", json={"version": 1})
        assert (rolled.json()["version"], rolled.json()["spec"]["instructions"]) == (3, "ONE")
        versions = (await http.get(f"{base}/web/versions")).json()["versions"]
        assert [v["version"] for v in versions] == [1, 2, 3]
        shown = (await http.get(f"{base}/web")).json()
        assert shown["spec"]["sub_agents"] == ["explore"] and shown["spec"]["max_steps"] == 5
        bad = await http.post(base, json={"spec": {"name": "web2", "instructions": "x", "top_p": 7}})
        assert bad.status_code == 400 and bad.json()["error"]["metadata"]["field"] == "spec.top_p"
        assert (await http.delete(f"{base}/web")).json()["removed_versions"] == 3
    lines = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    changes = [(e["action"], e.get("agent"), e.get("version")) for e in lines if e["action"].startswith("agent.")]
    assert changes == [("agent.create", "web", 1), ("agent.update", "web", 2), ("agent.rollback", "web", 3),
                       ("agent.delete", "web", 0)]


async def test_delegate_task_names_an_agent_which_the_namespace_may_override(stack, llm):
    gateway = stack.gateway_stub()
    # The namespace's own `plan` replaces the built-in, for every parent.
    await gateway.CreateAgent(agents_pb2.CreateAgentRequest(spec=spec(
        "plan", "You are OUR PLANNER.", tools=common_pb2.ToolPolicy(allow=["read_file"]))))
    await gateway.CreateAgent(agents_pb2.CreateAgentRequest(spec=spec(
        "boss", "You are BOSS.", sub_agents=["plan"])))
    llm.add(reply("", tool_call("delegate_task", {"task": "plan the release", "agent": "plan"})),
            reply("1. tag 2. ship"), reply("planned"))
    events = await chat(gateway, "s", "plan it", agent="boss")
    assert of_kind(events, "run_finished")[0].final_text == "planned"
    to_child = llm.requests[1]
    assert "You are OUR PLANNER." in to_child.messages[0]["content"]
    assert tool_names(to_child) == ["read_file"]
    (result,) = [e for e in of_kind(events, "tool_result") if e.result.name == "delegate_task"]
    data = json_format.MessageToDict(result.result.data)
    assert (data["agent"], data["agent_version"]) == ("plan", 1) and "1. tag 2. ship" in result.result.output
