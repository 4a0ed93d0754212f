"""Approvals in the agent: the loop holding calls for a decision (in-test ports, real model wire),
and the decision travelling on the RunTurn stream over real gRPC."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentmesh.agent.loop.run import TurnRequest
from agentmesh.agent.settings import AgentSettings, parse_tool_names
from agentmesh.agent.types import (
    ApprovalRequestEvent,
    ApprovalResolvedEvent,
    RunFinishedEvent,
    ToolCall,
    ToolOutcome,
    ToolResultEvent,
)
from agentmesh.internal.v1 import agent_service_pb2
from agentmesh.v1 import common_pb2, gateway_pb2
from tests.agent.agent_fakes import FakeTools, FakeTranscripts, ok
from tests.agent.test_agent_loop import make_agent, of
from tests.agent.test_agent_service import SERVICES, agent_stub, open_session, stored
from tests.support.llm_server import ScriptedLLMServer, reply, tool_call
from tests.support.stack import Stack


async def echo(call: ToolCall) -> ToolOutcome:
    return ok(call, f"ran {call.name}")


async def drive(run, decide) -> list:
    """Consume a run; `decide(event)` is called for each approval request and may call run.decide."""
    events = []
    async for event in run.events():
        events.append(event)
        if isinstance(event, ApprovalRequestEvent):
            decide(event)
    return events


def test_the_policy_comes_from_the_environment():
    settings = AgentSettings.from_env({"AGENTMESH_AGENT_APPROVAL_TOOLS": " shell, python,,web_fetch ",
                                       "AGENTMESH_AGENT_APPROVAL_TIMEOUT_S": "30"})
    assert settings.approval_tools == {"shell", "python", "web_fetch"} and settings.approval_timeout_s == 30
    default = AgentSettings.from_env({})
    assert default.approval_tools == frozenset() and default.approval_timeout_s == 600
    assert parse_tool_names("") == frozenset()


async def test_approved_runs_denied_does_not_and_the_model_reads_the_note(http, telemetry):
    tools = FakeTools({"shell": echo, "python": echo, "read_file": echo})
    steps = [
        reply("", tool_call("shell", {"command": "ls"}, id="a"), tool_call("python", {"code": "1"}, id="b"),
              tool_call("read_file", {"path": "x"}, id="c")),
        reply("done"),
    ]
    with ScriptedLLMServer(steps) as llm:
        agent = make_agent(http, llm, tools, FakeTranscripts(), telemetry,
                           approval_tools=frozenset({"shell", "python"}))
        run = agent.start(TurnRequest("s1", "r1", "go"))
        decisions = {"a": (True, ""), "b": (False, "no python today")}
        events = await drive(run, lambda e: run.decide(e.call.call_id, *decisions[e.call.call_id]))
        second = llm.requests[1].body

    assert sorted(e.call.call_id for e in of(events, ApprovalRequestEvent)) == ["a", "b"]
    assert all(e.timeout_s == 600 for e in of(events, ApprovalRequestEvent))
    resolved = {e.call.call_id: e for e in of(events, ApprovalResolvedEvent)}
    assert resolved["a"].approved and not resolved["b"].approved and resolved["b"].note == "no python today"
    assert {c.call_id for c in tools.calls} == {"a", "c"}  # read_file needed no approval; python was denied
    results = {e.result.call_id: e.result for e in of(events, ToolResultEvent)}
    assert not results["a"].is_error and not results["c"].is_error
    assert results["b"].is_error and results["b"].error_kind == "denied"
    assert results["b"].output == "error: python was not run: denied by the user: no python today"
    tool_messages = [m for m in second["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == ["a", "b", "c"]
    assert "no python today" in tool_messages[1]["content"]
    # A decision on a call that is no longer waiting changes nothing.
    assert run.decide("a", False) is False


async def test_no_decision_in_time_is_a_denial(http, telemetry):
    tools = FakeTools({"shell": echo})
    steps = [reply("", tool_call("shell", {"command": "rm -rf /"}, id="a")), reply("ok, I will not")]
    with ScriptedLLMServer(steps) as llm:
        agent = make_agent(http, llm, tools, FakeTranscripts(), telemetry,
                           approval_tools=frozenset({"shell"}), approval_timeout_s=0.2)
        events = await drive(agent.start(TurnRequest("s1", "r1", "go")), lambda e: None)

    resolved = of(events, ApprovalResolvedEvent)[0]
    assert (resolved.approved, resolved.decided_by) == (False, "timeout")
    result = of(events, ToolResultEvent)[0].result
    assert result.error_kind == "denied" and result.output == "error: shell was not run: no decision within 0.2 s"
    assert tools.calls == []
    assert events[-1].final_text == "ok, I will not"
    waits = [span for span in telemetry.finished_spans() if span.name == "await_approval shell"]
    assert len(waits) == 1 and waits[0].attributes["agentmesh.approval.decided_by"] == "timeout"
    assert waits[0].attributes["gen_ai.tool.call.id"] == "a"


async def test_a_turn_adds_tools_to_the_policy_and_star_means_all(http, telemetry):
    tools = FakeTools({"shell": echo, "read_file": echo})
    steps = [reply("", tool_call("read_file", {}, id="a")), reply("done")]
    with ScriptedLLMServer(steps) as llm:
        agent = make_agent(http, llm, tools, FakeTranscripts(), telemetry, approval_tools=frozenset({"shell"}))
        run = agent.start(TurnRequest("s1", "r1", "go", approval_tools=frozenset({"*"})))
        events = await drive(run, lambda e: run.decide(e.call.call_id, False))
    assert [e.call.name for e in of(events, ApprovalRequestEvent)] == ["read_file"]
    assert tools.calls == []


async def test_cancel_while_waiting_closes_the_step_and_runs_nothing(http, telemetry):
    tools = FakeTools({"shell": echo})
    transcripts = FakeTranscripts()
    with ScriptedLLMServer([reply("", tool_call("shell", {}, id="a"))]) as llm:
        agent = make_agent(http, llm, tools, transcripts, telemetry, approval_tools=frozenset({"shell"}))
        run = agent.start(TurnRequest("s1", "r1", "go"))
        events = await drive(run, lambda e: run.cancel())

    assert isinstance(events[-1], RunFinishedEvent) and events[-1].stop_reason == "cancelled"
    assert tools.calls == []
    assert [m.role for m in transcripts.history["s1"]] == ["user", "assistant", "tool"]
    assert "cancelled" in transcripts.history["s1"][-1].content


# --- over the wire: the decision rides the RunTurn stream -----------------------------------


@pytest.fixture
async def stack(tmp_path, llm):
    env = {"AGENTMESH_AGENT_APPROVAL_TOOLS": "shell"}
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=env, services=SERVICES) as running:
        yield running


async def test_a_decision_sent_on_the_run_turn_stream_reaches_the_held_call(stack, llm):
    await open_session(stack, "wire")
    llm.add(reply("", tool_call("shell", {"command": "echo hi > hi.txt"}, id="h")), reply("Done."))
    decisions: asyncio.Queue = asyncio.Queue()

    async def requests():
        yield agent_service_pb2.RunTurnRequest(session_id="wire", run_id="run-1", message="go")
        yield await decisions.get()

    events = []
    async for event in agent_stub(stack).RunTurn(requests(), timeout=30):
        events.append(event)
        if event.WhichOneof("payload") == "approval_request":
            held = event.approval_request
            assert (held.call_id, held.name) == ("h", "shell")
            assert json.loads(held.arguments_json) == {"command": "echo hi > hi.txt"}
            decision = common_pb2.ApprovalDecision(call_id="h", approved=True)
            decisions.put_nowait(agent_service_pb2.RunTurnRequest(decision=decision))

    kinds = [e.WhichOneof("payload") for e in events]
    assert kinds[-1] == "run_finished" and "approval_resolved" in kinds
    assert (stack.settings.home / "workspaces" / "wire" / "hi.txt").read_text() == "hi\n"
    assert [m.role for m in await stored(stack, "wire")] == ["user", "assistant", "tool", "assistant"]


async def test_run_turn_refuses_a_stream_that_does_not_start_with_the_turn(stack, llm):
    import grpc

    first = agent_service_pb2.RunTurnRequest(decision=common_pb2.ApprovalDecision(call_id="x", approved=True))
    bad_tools = agent_service_pb2.RunTurnRequest(session_id="ok", message="hi",
                                         options=gateway_pb2.ChatOptions(approval_tools=["x" * 129]))
    for request, words in [(first, "must start"), (bad_tools, "approval_tools")]:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            [e async for e in agent_stub(stack).RunTurn(iter([request]), timeout=10)]
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and words in info.value.details()
    assert llm.requests == []

