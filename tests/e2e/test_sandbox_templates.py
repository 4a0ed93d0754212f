"""Sandbox templates chosen per namespace and per named agent, end to end over real gRPC across
the five services (docs/tools.md#sandbox-templates): the gateway checks the name a person sets,
the agent sends the chosen template with every call, and the tools service runs it there — a
`session` template's interpreter keeps `x` between turns where the default's does not."""

from __future__ import annotations

import json
import shutil

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from agentmesh import error_reasons
from agentmesh.v1 import agents_pb2, common_pb2, gateway_pb2, sessions_pb2
from tests.e2e.conftest import chat, of_kind, rpc_error
from tests.support.llm_server import ScriptedLLMServer, reply, tool_call
from tests.support.stack import Stack

pytestmark = pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap")


@pytest.fixture
def llm():
    with ScriptedLLMServer() as server:
        yield server


@pytest.fixture
async def stack(tmp_path, llm):
    templates = tmp_path / "templates.json"
    templates.write_text(json.dumps({"notebook": {"isolation": "session"}}))
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url,
                     env={"AGENTMESH_SANDBOX_TEMPLATES": str(templates)}) as running:
        yield running


async def python_turns(gateway, llm, session_id: str, **options) -> str:
    """Two turns: the first sets x, the second prints x + 1; the second call's output."""
    llm.add(reply("", tool_call("python", {"code": "x = 41"}, id="a")), reply("set"),
            reply("", tool_call("python", {"code": "print(x + 1)"}, id="b")), reply("printed"))
    await chat(gateway, session_id, "set x", **options)
    events = await chat(gateway, session_id, "print x + 1", **options)
    return of_kind(events, "tool_result")[0].result.output


async def test_a_namespaces_template_is_checked_and_its_sessions_run_in_it(stack, llm):
    gateway = stack.gateway_stub()
    await gateway.UpdateNamespaceSettings(sessions_pb2.UpdateNamespaceSettingsRequest(
        namespace="team", tools=common_pb2.ToolPolicy(deny=["web_fetch"])), timeout=10)
    err = await rpc_error(gateway.UpdateNamespaceSettings(sessions_pb2.UpdateNamespaceSettingsRequest(
        namespace="team", tools=common_pb2.ToolPolicy(deny=["web_fetch"]), sandbox_template="gpu"), timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "no sandbox template 'gpu'" in err.details()
    infos = [i for d in rpc_status.from_call(err).details if d.Unpack(i := error_details_pb2.ErrorInfo())]
    assert infos[0].reason == error_reasons.UNKNOWN_SANDBOX_TEMPLATE
    kept = await gateway.GetNamespaceSettings(sessions_pb2.GetNamespaceSettingsRequest(namespace="team"), timeout=10)
    assert kept.sandbox_template == ""

    chosen = await gateway.UpdateNamespaceSettings(sessions_pb2.UpdateNamespaceSettingsRequest(
        namespace="team", tools=kept.tools, sandbox_template="notebook"), timeout=10)
    assert chosen.sandbox_template == "notebook" and list(chosen.tools.deny) == ["web_fetch"]
    # A change of the policy alone keeps the template.
    again = await gateway.UpdateNamespaceSettings(sessions_pb2.UpdateNamespaceSettingsRequest(
        namespace="team", tools=common_pb2.ToolPolicy(deny=["shell"])), timeout=10)
    assert again.sandbox_template == "notebook"

    await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id="in-team", namespace="team"), timeout=10)
    assert await python_turns(gateway, llm, "in-team") == "42"
    await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id="elsewhere"), timeout=10)
    assert "NameError" in await python_turns(gateway, llm, "elsewhere")  # the default: a fresh one per call


async def test_a_named_agents_template_is_used_for_its_turns(stack, llm):
    gateway = stack.gateway_stub()
    await gateway.CreateAgent(agents_pb2.CreateAgentRequest(namespace="default", spec=agents_pb2.AgentSpec(
        name="analyst", description="analyses", instructions="You analyse.", sandbox_template="notebook")), timeout=10)
    assert await python_turns(gateway, llm, "with-agent", agent="analyst") == "42"


async def test_an_agent_with_an_isolation_that_is_not_one_is_refused(stack):
    err = await rpc_error(stack.gateway_stub().CreateAgent(agents_pb2.CreateAgentRequest(
        namespace="default", spec=agents_pb2.AgentSpec(name="odd", instructions="x", isolation="vm")), timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "isolation must be call or session" in err.details()


async def test_a_sessions_template_is_over_its_namespaces(stack, llm):
    gateway = stack.gateway_stub()
    await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id="own"), timeout=10)
    err = await rpc_error(gateway.UpdateSession(sessions_pb2.UpdateSessionRequest(
        session_id="own", sandbox_template="gpu", update_mask=["sandbox_template"]), timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "no sandbox template 'gpu'" in err.details()
    session = await gateway.UpdateSession(sessions_pb2.UpdateSessionRequest(
        session_id="own", sandbox_template="notebook", update_mask=["sandbox_template"]), timeout=10)
    assert session.sandbox_template == "notebook" and session.model == ""
    assert await python_turns(gateway, llm, "own") == "42"


async def test_the_cli_lists_the_templates_and_sets_a_namespaces(stack):
    from tests.e2e.test_auth_and_cli import run_cli

    code, out, err = await run_cli(stack, "sandbox", "templates")
    assert code == 0, err
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    assert rows["default"][1:3] == ["call", "none"] and rows["notebook"][1:3] == ["session", "none"]
    code, out, err = await run_cli(stack, "sandbox", "use", "notebook", "--namespace", "team")
    assert code == 0 and "namespace team: command tools run in the sandbox template notebook" in out, err
    code, _, err = await run_cli(stack, "sandbox", "use", "gpu", "--namespace", "team")
    assert code == 1 and "no sandbox template 'gpu'" in err
    settings = await stack.gateway_stub().GetNamespaceSettings(
        sessions_pb2.GetNamespaceSettingsRequest(namespace="team"), timeout=10)
    assert settings.sandbox_template == "notebook"
