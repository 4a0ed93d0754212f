"""Sub-agents (`delegate_task`): child turns run by the agent itself, with in-test ports and a
real model wire. The model is a ScriptedLLMServer whose replies are chosen by a function of the
request, since parent and children call it concurrently."""

from __future__ import annotations

import asyncio
import threading

from opentelemetry.trace import StatusCode

from agentmesh.agent.capabilities.subagents import child_session_id
from agentmesh.agent.loop.run import TurnRequest
from agentmesh.agent.types import (
    ApprovalRequestEvent,
    ApprovalResolvedEvent,
    RunFinishedEvent,
    StatusEvent,
    SubagentEvent,
    ToolCall,
    ToolOutcome,
    ToolResultEvent,
)
from agentmesh.errors import Unavailable
from tests.agent.agent_fakes import FakeTools, FakeTranscripts, cancel_once, ok
from tests.agent.test_agent_loop import collect, make_agent, of
from tests.support.llm_server import ScriptedLLMServer, failure, reply, tool_call

SUB = "You are a sub-agent"
ANYWHERE = frozenset({"default", "deep"})  # offer delegate_task in the default mode, so no plan step


def is_child(request) -> bool:
    return SUB in request.messages[0]["content"]


def task_of(request) -> str:
    return next(m["content"] for m in request.messages if m["role"] == "user")


def tools_of(request) -> list[str]:
    return [t["function"]["name"] for t in request.body.get("tools") or []]


def tool_results(request) -> list[str]:
    return [m["content"] for m in request.messages if m["role"] == "tool"]


def delegate(task: str, id: str, **extra):
    return tool_call("delegate_task", {"task": task, **extra}, id=id)


class WorkspaceTools(FakeTools):
    """FakeTools that also records which session's workspace each call ran in."""

    def __init__(self, handlers):
        super().__init__(handlers)
        self.workspaces: list[str] = []

    async def execute(self, session_id: str, call: ToolCall, namespace: str = "", *,
                      mcp_version: float | None = None, sandbox_template: str = "", isolation: str = "") -> ToolOutcome:
        self.workspaces.append(session_id)
        return await super().execute(session_id, call)


class RecordingSessions:
    def __init__(self, fail: bool = False):
        self.opened: list[tuple[str, str, str]] = []
        self.fail = fail

    async def open_child(self, session_id: str, *, parent_session_id: str, namespace: str, title: str) -> None:
        if self.fail:
            raise Unavailable("the memory service at 127.0.0.1:1 is not answering")
        self.opened.append((session_id, parent_session_id, namespace))


async def echo(call: ToolCall) -> ToolOutcome:
    return ok(call, f"echo {call.arguments_json}")


async def test_two_delegations_run_in_parallel_and_come_back_in_call_order(http, telemetry):
    started = {"alpha": threading.Event(), "beta": threading.Event()}
    child_requests = []

    def model(request):
        if is_child(request):
            child_requests.append(request)
            name = "alpha" if "alpha" in task_of(request) else "beta"
            other = "beta" if name == "alpha" else "alpha"
            started[name].set()
            # Each child's answer waits for the other child's model call to have started:
            # both answers say "saw" only if the two children ran at the same time.
            saw = started[other].wait(5)
            return reply(f"{name} result ({'saw' if saw else 'missed'} {other})", usage=(7, 3))
        if not tool_results(request):
            return reply("Delegating.", delegate("task alpha: count the files", "d1", instructions="Be terse."),
                         delegate("task beta: read the notes", "d2"), usage=(100, 10))
        return reply("Combined: " + " | ".join(tool_results(request)), usage=(200, 20))

    transcripts = FakeTranscripts()
    sessions = RecordingSessions()
    with ScriptedLLMServer(default=model) as llm:
        agent = make_agent(http, llm, FakeTools({"echo": echo}), transcripts, telemetry, subagent_modes=ANYWHERE)
        agent.sessions = sessions
        events = await collect(agent.start(TurnRequest("s1", "r1", "do both", namespace="team-a")))
        parent_requests = [r for r in llm.requests if not is_child(r)]

    finished = events[-1]
    assert isinstance(finished, RunFinishedEvent) and finished.stop_reason == "completed"
    assert finished.final_text == "Combined: alpha result (saw beta) | beta result (saw alpha)"
    # The children's tokens are part of the turn's usage; iterations count the parent's calls.
    assert (finished.usage.input_tokens, finished.usage.output_tokens) == (314, 36)
    assert finished.iterations == 2

    results = {e.result.call_id: e.result for e in of(events, ToolResultEvent)}
    ids = {c: child_session_id("s1", "r1", c) for c in ("d1", "d2")}
    assert ids["d1"] != ids["d2"] and ids["d1"].startswith("s1.sub-")
    for call_id in ("d1", "d2"):
        assert not results[call_id].is_error
        assert results[call_id].data["session_id"] == ids[call_id]
        assert results[call_id].data["stop_reason"] == "completed"
    # Each child's transcript lives in its own session; its runs are its own.
    alpha = transcripts.history[ids["d1"]]
    assert [(m.role, m.content) for m in alpha] == [("user", "task alpha: count the files"),
                                                    ("assistant", "alpha result (saw beta)")]
    assert alpha[0].run_id != "r1"
    assert sorted(sessions.opened) == sorted((ids[c], "s1", "team-a") for c in ("d1", "d2"))
    # The model got the results in call order (the final text above); each was saved as it came.
    assert [m["tool_call_id"] for m in parent_requests[1].messages if m["role"] == "tool"] == ["d1", "d2"]
    assert sorted(m.tool_call_id for m in transcripts.history["s1"] if m.role == "tool") == ["d1", "d2"]

    # The tool is offered to the parent only; a child gets the role it was given.
    assert "delegate_task" in tools_of(parent_requests[0])
    # Sub-agents nest two deep by default: a child may delegate once more.
    assert all("delegate_task" in tools_of(r) for r in child_requests)
    alpha_request = next(r for r in child_requests if "alpha" in task_of(r))
    assert "Be terse." in alpha_request.messages[0]["content"]

    statuses = [e.message for e in of(events, StatusEvent)]
    assert f"sub-agent 1 (task alpha: count the files): started in session {ids['d1']}" in statuses
    assert any(s.startswith("sub-agent 2 (task beta: read the notes): finished (completed)") for s in statuses)

    # Spans: each child's invoke_agent hangs under the parent's execute_tool delegate_task.
    spans = telemetry.finished_spans()
    invokes = [s for s in spans if s.name == "invoke_agent"]
    root = next(s for s in invokes if s.parent is None)
    children = [s for s in invokes if s.parent is not None]
    delegations = {s.attributes["gen_ai.tool.call.id"]: s for s in spans if s.name == "execute_tool delegate_task"}
    assert len(children) == 2 and set(delegations) == {"d1", "d2"}
    for child in children:
        holder = next(d for d in delegations.values() if d.context.span_id == child.parent.span_id)
        assert holder.parent.span_id == root.context.span_id
        assert child.context.trace_id == root.context.trace_id
        assert child.attributes["gen_ai.agent.name"] == "agentmesh/sub-agent"
        assert child.attributes["agentmesh.subagent.parent_session_id"] == "s1"
        assert child.attributes["gen_ai.conversation.id"] == ids[holder.attributes["gen_ai.tool.call.id"]]
        chats = [s for s in spans if s.name.startswith("chat") and s.parent.span_id == child.context.span_id]
        assert len(chats) == 1
    assert root.attributes["gen_ai.agent.name"] == "agentmesh"


async def test_a_failing_child_is_an_error_result_and_the_parent_completes(http, telemetry):
    def model(request):
        if is_child(request):
            task = task_of(request)
            if "broken" in task:
                return failure(400, message="the child's request was rejected")
            # The looping child never stops calling tools; its summary call has tool_choice none.
            if request.body["tool_choice"] == "none":
                return reply("I echoed once; not finished.")
            return reply("", tool_call("echo", {"n": 1}))
        if not tool_results(request):
            return reply("", delegate("broken task", "a"), delegate("loop task", "b", max_iterations=1),
                         tool_call("delegate_task", {"task": "  "}, id="c"),
                         delegate("too many steps", "d", max_iterations=99))
        return reply("Handled the failures.")

    transcripts = FakeTranscripts()
    with ScriptedLLMServer(default=model) as llm:
        agent = make_agent(http, llm, FakeTools({"echo": echo}), transcripts, telemetry, subagent_modes=ANYWHERE,
                           subagent_max_iterations=5)
        events = await collect(agent.start(TurnRequest("s1", "r1", "try it")))

    results = {e.result.call_id: e.result for e in of(events, ToolResultEvent) if e.result.name == "delegate_task"}
    assert results["a"].is_error and results["a"].error_kind == "subagent_failed"
    assert "INVALID_ARGUMENT" in results["a"].output and "the child's request was rejected" in results["a"].output
    assert results["b"].is_error and results["b"].error_kind == "subagent_limit"
    assert "all 1 of its steps" in results["b"].output and "I echoed once" in results["b"].output
    assert results["c"].error_kind == "invalid_arguments" and "'task' is empty" in results["c"].output
    assert results["d"].error_kind == "invalid_arguments" and "max_iterations: 99 is greater than the maximum of 5" in results["d"].output
    assert events[-1].stop_reason == "completed" and events[-1].final_text == "Handled the failures."
    # The failed child kept what it had done: the task it was given.
    failed = transcripts.history[child_session_id("s1", "r1", "a")]
    assert [m.role for m in failed] == ["user"]
    statuses = [e.message for e in of(events, StatusEvent)]
    assert any(s.startswith("sub-agent ") and "calling echo" in s for s in statuses)
    assert any("failed (INVALID_ARGUMENT" in s for s in statuses)
    # Each child that started ends with an event of its own saying how.
    ends = {e.call_id: e for e in of(events, SubagentEvent) if e.state == "finished"}
    assert (ends["a"].stop_reason, ends["b"].stop_reason, ends["b"].iterations) == ("error", "max_iterations", 2)  # its step and its summary
    assert set(ends) == {"a", "b"} and ends["b"].usage.total_tokens > 0


async def test_depth_limit_turn_cap_and_shared_workspace(http, telemetry):
    def model(request):
        task = task_of(request)
        if is_child(request):
            if tool_results(request):
                return reply(f"done: {tool_results(request)[-1]}")
            if task == "outer" and "delegate_task" in tools_of(request):
                return reply("", delegate("inner", "g1"))
            return reply("", tool_call("echo", {"from": task}, id=f"e-{task}"))
        if not tool_results(request):
            return reply("", delegate("outer", "p1"), delegate("second", "p2"))
        return reply("ok")

    tools = WorkspaceTools({"echo": echo})
    transcripts = FakeTranscripts()
    with ScriptedLLMServer(default=model) as llm:
        agent = make_agent(http, llm, tools, transcripts, telemetry, subagent_modes=ANYWHERE,
                           subagent_max_depth=2, max_subagents=1)
        events = await collect(agent.start(TurnRequest("root", "r1", "go")))
        requests = list(llm.requests)

    results = {e.result.call_id: e.result for e in of(events, ToolResultEvent)}
    # One sub-agent per turn: the reply's calls start in call order, so the second is refused.
    assert results["p2"].is_error and results["p2"].error_kind == "too_many_subagents"
    assert "limit of 1 sub-agents" in results["p2"].output
    outer = child_session_id("root", "r1", "p1")
    inner_run = transcripts.history[outer][0].run_id
    inner = child_session_id(outer, inner_run, "g1")
    assert inner.startswith(outer + ".sub-")
    assert [m.role for m in transcripts.history[inner]] == ["user", "assistant", "tool", "assistant"]
    assert results["p1"].output == "done: done: echo {\"from\": \"inner\"}"
    # Depth 1 may delegate (max depth 2), depth 2 may not; all tools ran in the root's workspace.
    by_task = {task_of(r): tools_of(r) for r in requests if is_child(r)}
    assert "delegate_task" in by_task["outer"] and "delegate_task" not in by_task["inner"]
    assert tools.workspaces == ["root"]
    # The grandchild's start and end reach the root's stream too, one level deeper, inside its parent's.
    subs = [(e.state, e.depth, e.task, e.session_id) for e in of(events, SubagentEvent)]
    assert subs == [("started", 1, "outer", outer), ("started", 2, "inner", inner), ("finished", 2, "inner", inner),
                    ("finished", 1, "outer", outer)]


async def test_delegation_is_offered_only_where_configured(http, telemetry):
    with ScriptedLLMServer([reply("hi"), reply("hi again")]) as llm:
        agent = make_agent(http, llm, FakeTools({}), FakeTranscripts(), telemetry, subagent_modes=frozenset({"deep"}))
        await collect(agent.start(TurnRequest("s1", "r1", "hello")))
        off = make_agent(http, llm, FakeTools({}), FakeTranscripts(), telemetry, subagent_modes=ANYWHERE,
                         subagent_max_depth=0)
        await collect(off.start(TurnRequest("s2", "r2", "hello")))
        assert all("delegate_task" not in tools_of(r) for r in llm.requests)


async def test_a_child_session_that_cannot_be_created_is_an_error_result(http, telemetry):
    def model(request):
        if not tool_results(request):
            return reply("", delegate("anything", "x"))
        return reply("went on")

    with ScriptedLLMServer(default=model) as llm:
        agent = make_agent(http, llm, FakeTools({}), FakeTranscripts(), telemetry, subagent_modes=ANYWHERE)
        agent.sessions = RecordingSessions(fail=True)
        events = await collect(agent.start(TurnRequest("s1", "r1", "go")))
        assert not any(is_child(r) for r in llm.requests)
    result = of(events, ToolResultEvent)[0].result
    assert result.error_kind == "subagent_failed" and "not answering" in result.output
    assert events[-1].final_text == "went on"


async def test_cancelling_the_parent_cancels_its_children(http, telemetry):
    async def hang(call):
        await asyncio.Event().wait()

    def model(request):
        if is_child(request):
            return reply("", tool_call("hang", {}, id="h1"))
        return reply("", delegate("wait forever", "d"))

    tools = FakeTools({"hang": hang})
    transcripts = FakeTranscripts()
    with ScriptedLLMServer(default=model) as llm:
        agent = make_agent(http, llm, tools, transcripts, telemetry, subagent_modes=ANYWHERE)
        run = agent.start(TurnRequest("s1", "r1", "start"))
        events = await cancel_once(run, tools.started["hang"].wait(), timeout_s=10)

    assert tools.cancelled == ["h1"]
    assert isinstance(events[-1], RunFinishedEvent) and events[-1].stop_reason == "cancelled"
    assert [(e.state, e.stop_reason) for e in of(events, SubagentEvent)] == [("started", ""), ("finished", "cancelled")]
    child = transcripts.history[child_session_id("s1", "r1", "d")]
    assert [m.role for m in child] == ["user", "assistant", "tool"] and "cancelled" in child[-1].content
    parent = transcripts.history["s1"]
    assert parent[-1].role == "tool" and parent[-1].tool_call_id == "d" and "cancelled" in parent[-1].content
    spans = {s.name: s for s in telemetry.finished_spans()}
    assert spans["execute_tool delegate_task"].status.status_code == StatusCode.ERROR
    assert all(s.attributes.get("error.type") == "cancelled"
               for s in telemetry.finished_spans() if s.name == "invoke_agent")


async def test_a_childs_held_call_goes_through_the_parents_approval_gate(http, telemetry):
    def model(request):
        if is_child(request):
            if tool_results(request):
                return reply(f"child saw: {tool_results(request)[-1]}")
            return reply("", tool_call("shell", {"command": "ls"}, id="child-shell"))
        if not tool_results(request):
            return reply("", delegate("list files", "d"))
        return reply(tool_results(request)[0])

    tools = FakeTools({"shell": echo})
    with ScriptedLLMServer(default=model) as llm:
        agent = make_agent(http, llm, tools, FakeTranscripts(), telemetry, subagent_modes=ANYWHERE,
                           approval_tools=frozenset({"shell"}))
        run = agent.start(TurnRequest("s1", "r1", "go"))
        events = []
        async for event in run.events():
            events.append(event)
            if isinstance(event, ApprovalRequestEvent):
                assert run.decide(event.call.call_id, True, "fine")

    assert [e.call.call_id for e in of(events, ApprovalRequestEvent)] == ["child-shell"]
    assert [e.approved for e in of(events, ApprovalResolvedEvent)] == [True]
    assert [c.call_id for c in tools.calls] == ["child-shell"]
    assert events[-1].final_text == 'child saw: echo {"command": "ls"}'
