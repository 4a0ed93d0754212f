"""Deep work (`mode="deep"`): a plan first, reflection every N steps, progress events, a larger
step budget and sub-agents; invalid modes refused. In-test ports and a real model wire, and the
agent service over real gRPC for the refusal."""

from __future__ import annotations

import grpc
import pytest

from agentmesh.agent.loop.run import TurnRequest
from agentmesh.agent.loop.turn_request import step_budget
from agentmesh.agent.settings import AgentSettings
from agentmesh.agent.types import RunFinishedEvent, StatusEvent, ToolCall, ToolOutcome, ToolResultEvent
from agentmesh.errors import InvalidArgument
from agentmesh.internal.v1 import agent_service_pb2
from agentmesh.modes import validate_mode
from agentmesh.v1 import gateway_pb2
from tests.agent.agent_fakes import FakeTools, FakeTranscripts, ok
from tests.agent.test_agent_loop import collect, make_agent, of
from tests.agent.test_agent_service import SERVICES, agent_stub, open_session, stored
from tests.support.llm_server import ScriptedLLMServer, reply, tool_call
from tests.support.stack import Stack


async def echo(call: ToolCall) -> ToolOutcome:
    return ok(call, f"echo {call.arguments_json}")


def last(request) -> dict:
    return request.messages[-1]


def planning(request) -> bool:
    return last(request)["role"] == "system" and "numbered plan" in last(request)["content"] \
        and "Reflection" not in last(request)["content"]


def reflecting(request) -> bool:
    return last(request)["role"] == "system" and last(request)["content"].startswith("Reflection after step")


async def test_plan_first_reflection_on_schedule_and_the_step_budget(http, telemetry):
    reflections = []

    def model(request):
        if planning(request):
            return reply("1. echo a\n2. echo b\n3. report", usage=(50, 5))
        if reflecting(request):
            reflections.append(request)
            return reply(f"1. [done] echo a\n2. echo b again (revision {len(reflections)})\n3. report")
        if request.body["tool_choice"] == "none":
            return reply("Summary: echoed five times.")
        return reply("", tool_call("echo", {"n": len(request.messages)}))

    transcripts = FakeTranscripts()
    with ScriptedLLMServer(default=model) as llm:
        # Without the task board (TASK_MODES empty): the plan stays free text (see test_agent_tasks for the board).
        agent = make_agent(http, llm, FakeTools({"echo": echo}), transcripts, telemetry,
                           deep_max_iterations=5, deep_reflect_every=2, task_modes=frozenset())
        events = await collect(agent.start(TurnRequest("s1", "r1", "do deep work", mode="deep")))
        requests = list(llm.requests)

    # The plan comes first: one call without tools, before any step.
    assert planning(requests[0]) and requests[0].body["tool_choice"] == "none"
    kinds = ["plan" if planning(r) else "reflect" if reflecting(r) else
             "summary" if r.body["tool_choice"] == "none" else "step" for r in requests]
    # 5 steps (the deep budget); reflection before steps 3 and 5 (every 2); then the summary.
    assert kinds == ["plan", "step", "step", "reflect", "step", "step", "reflect", "step", "summary"]
    finished = events[-1]
    assert isinstance(finished, RunFinishedEvent)
    assert (finished.stop_reason, finished.iterations) == ("max_iterations", 9)
    assert finished.final_text == "Summary: echoed five times."
    assert len(of(events, ToolResultEvent)) == 5

    # The plan is pinned right after the user's message in every later call; a reflection replaces it.
    def pinned(request) -> str:
        assert request.messages[1]["role"] == "user" and request.messages[2]["role"] == "system"
        return request.messages[2]["content"]

    assert "1. echo a\n2. echo b\n3. report" in pinned(requests[1])
    assert "revision 1" in pinned(requests[4]) and "revision 2" in pinned(requests[7])
    assert "after step 2 of 5" in last(reflections[0])["content"]
    assert "1. echo a" in pinned(reflections[0])  # a reflection sees the plan it revises

    statuses = [e.message for e in of(events, StatusEvent)]
    assert statuses[0] == "deep work: planning before acting (up to 5 steps)"
    assert "plan ready (3 steps)" in statuses
    assert [s for s in statuses if s.startswith("step ")] == [
        "step 1 of 5", "step 2 of 5", "step 3 of 5 — reflecting on the plan", "step 4 of 5",
        "step 5 of 5 — reflecting on the plan"]

    # Plan and revisions are persisted; the system notes are not.
    stored_ = transcripts.history["s1"]
    assert stored_[1].role == "assistant" and stored_[1].content == "Plan:\n1. echo a\n2. echo b\n3. report"
    revised = [m.content for m in stored_ if m.content.startswith("Revised plan")]
    assert [r.splitlines()[0] for r in revised] == ["Revised plan (after step 2):", "Revised plan (after step 4):"]
    assert all(m.role != "system" for m in stored_)


async def test_deep_mode_offers_sub_agents_and_finishes_early_when_done(http, telemetry):
    def model(request):
        if planning(request):
            return reply("1. delegate the research\n2. answer")
        if "You are a sub-agent" in request.messages[0]["content"]:
            # A child runs in the default mode: no plan, no step notes.
            assert not planning(request)
            return reply("the research result")
        if not any(m["role"] == "tool" for m in request.messages):
            assert "delegate_task" in [t["function"]["name"] for t in request.body["tools"]]
            return reply("", tool_call("delegate_task", {"task": "research it"}, id="d"))
        return reply("Answer based on: the research result")

    with ScriptedLLMServer(default=model) as llm:
        agent = make_agent(http, llm, FakeTools({}), FakeTranscripts(), telemetry, task_modes=frozenset())
        events = await collect(agent.start(TurnRequest("s1", "r1", "research and answer", mode="deep")))
        child_requests = [r for r in llm.requests if "You are a sub-agent" in r.messages[0]["content"]]

    assert events[-1].stop_reason == "completed" and events[-1].final_text == "Answer based on: the research result"
    assert events[-1].iterations == 3  # plan + two steps
    assert len(child_requests) == 1
    # Sub-agents nest two deep by default: the child (depth 1) may delegate once more.
    assert "delegate_task" in [t["function"]["name"] for t in child_requests[0].body.get("tools", [])]
    statuses = [e.message for e in of(events, StatusEvent)]
    assert "step 2 of 50" in statuses and not any("reflecting" in s for s in statuses)


async def test_an_empty_plan_is_noted_and_not_pinned(http, telemetry):
    with ScriptedLLMServer([reply(""), reply("done")]) as llm:
        agent = make_agent(http, llm, FakeTools({}), FakeTranscripts(), telemetry)
        events = await collect(agent.start(TurnRequest("s1", "r1", "quick", mode="deep")))
        second = llm.requests[1]
    assert "the model wrote no plan; continuing without one" in [e.message for e in of(events, StatusEvent)]
    assert [m["role"] for m in second.messages] == ["system", "user"]
    assert events[-1].final_text == "done"


def test_step_budget_and_mode_validation():
    settings = AgentSettings(max_iterations=12, deep_max_iterations=50, max_iterations_cap=40)
    assert step_budget(TurnRequest("s", "r", "m"), settings) == 12
    assert step_budget(TurnRequest("s", "r", "m", mode="deep"), settings) == 40  # the cap wins
    assert step_budget(TurnRequest("s", "r", "m", mode="deep", max_iterations=7), settings) == 7
    assert validate_mode("") == "default" and validate_mode("deep") == "deep"
    with pytest.raises(InvalidArgument) as info:
        validate_mode("turbo")
    assert info.value.message == "options.mode 'turbo' is not a run mode: use \"default\" (or leave it empty) or \"deep\""


def test_settings_come_from_the_environment():
    settings = AgentSettings.from_env({
        "AGENTMESH_AGENT_DEEP_MAX_ITERATIONS": "30", "AGENTMESH_AGENT_DEEP_REFLECT_EVERY": "0",
        "AGENTMESH_AGENT_SUBAGENT_MAX_DEPTH": "3", "AGENTMESH_AGENT_MAX_SUBAGENTS": "3",
        "AGENTMESH_AGENT_SUBAGENT_MAX_ITERATIONS": "6", "AGENTMESH_AGENT_SUBAGENT_TIMEOUT_S": "60",
        "AGENTMESH_AGENT_SUBAGENT_MODES": "default, deep",
    })
    assert (settings.deep_max_iterations, settings.deep_reflect_every) == (30, 0)
    assert (settings.subagent_max_depth, settings.max_subagents, settings.subagent_max_iterations) == (3, 3, 6)
    assert settings.subagent_timeout_s == 60 and settings.subagent_modes == {"default", "deep"}
    default = AgentSettings.from_env({})
    assert (default.deep_max_iterations, default.deep_reflect_every, default.subagent_max_depth,
            default.max_subagents, default.subagent_modes) == (50, 8, 2, 8, {"default", "deep"})


async def test_the_agent_service_refuses_an_unknown_mode_and_runs_deep(tmp_path):
    def model(request):
        if planning(request):
            return reply("1. answer")
        return reply("deep answer")

    with ScriptedLLMServer(default=model) as llm:
        async with Stack(tmp_path / "home", llm_base_url=llm.base_url, services=SERVICES,
                         env={"AGENTMESH_AGENT_TASK_MODES": "none"}) as stack:  # the free-text plan
            await open_session(stack, "deep-wire")
            bad = agent_service_pb2.RunTurnRequest(session_id="deep-wire", message="hi",
                                           options=gateway_pb2.ChatOptions(mode="fast"))
            with pytest.raises(grpc.aio.AioRpcError) as info:
                _ = [e async for e in agent_stub(stack).RunTurn(iter([bad]), timeout=10)]
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "'fast' is not a run mode" in info.value.details() and '"deep"' in info.value.details()
            assert llm.requests == [] and await stored(stack, "deep-wire") == []

            good = agent_service_pb2.RunTurnRequest(session_id="deep-wire", message="hi",
                                            options=gateway_pb2.ChatOptions(mode="deep"))
            events = [e async for e in agent_stub(stack).RunTurn(iter([good]), timeout=30)]
            assert events[-1].run_finished.final_text == "deep answer"
            assert [m.content for m in await stored(stack, "deep-wire")] == ["hi", "Plan:\n1. answer", "deep answer"]
