"""The agent loop with in-test ports (tools, transcripts, memory) and a real model wire."""

from __future__ import annotations

import asyncio
import datetime as dt
import json

import pytest
from opentelemetry.trace import StatusCode

from agentmesh.agent.capabilities.registry import for_turn
from agentmesh.agent.loop.run import Agent, TurnRequest
from agentmesh.agent.providers import OpenAIProvider, RetryPolicy, ScriptedProvider, http_client
from agentmesh.agent.settings import AgentSettings
from agentmesh.agent.types import (
    ChatMessage,
    RunErrorEvent,
    RunFinishedEvent,
    RunStartedEvent,
    StatusEvent,
    TextDeltaEvent,
    ToolCall,
    ToolCallEvent,
    ToolOutcome,
    ToolResultEvent,
)
from tests.agent.agent_fakes import FakeMemory, FakeTools, FakeTranscripts, cancel_once, ok
from tests.support.llm_server import ScriptedLLMServer, failure, reply, tool_call

KEY = "sk-loop-secret-key-0123456789"
NOW = dt.datetime(2026, 11, 21, 12, 30, tzinfo=dt.UTC)


def make_agent(http, llm, tools, transcripts, telemetry, memory=None, **overrides) -> Agent:
    settings = AgentSettings(**{"retry_base_s": 0.01, "recall_k": 3, **overrides})
    provider = OpenAIProvider(http, llm.base_url, KEY, RetryPolicy(max_retries=2, base_s=0.01))
    return Agent(provider, tools, transcripts, memory, settings, model="test-model", telemetry=telemetry,
                 capabilities=for_turn, clock=lambda: NOW)


async def collect(run) -> list:
    return [event async for event in run.events()]


def of(events, kind) -> list:
    return [e for e in events if isinstance(e, kind)]


async def echo(call: ToolCall) -> ToolOutcome:
    return ok(call, f"echo {call.arguments_json}")


async def test_two_concurrent_tool_calls_one_failing(http, telemetry):
    both_started = asyncio.Event()

    async def slow_ok(call):
        # Finishes only once the other call has started: passes only if they run concurrently.
        await asyncio.wait_for(tools.started["failing"].wait(), 5)
        both_started.set()
        return ok(call, "slow result")

    async def failing(call):
        await asyncio.wait_for(tools.started["slow_ok"].wait(), 5)
        return ToolOutcome(call_id=call.call_id, name=call.name, output="error: exit status 3", is_error=True,
                           error_kind="exit_status", exit_code=3)

    tools = FakeTools({"slow_ok": slow_ok, "failing": failing})
    transcripts = FakeTranscripts()
    steps = [
        reply("Running both.", tool_call("slow_ok", {"n": 1}, id="c1"), tool_call("failing", {}, id="c2"), usage=(100, 10)),
        reply("One worked, one failed.", usage=(200, 20)),
    ]
    with ScriptedLLMServer(steps) as llm:
        agent = make_agent(http, llm, tools, transcripts, telemetry)
        events = await collect(agent.start(TurnRequest(session_id="s1", run_id="r1", message="do both")))
        second = llm.requests[1].body

    assert isinstance(events[0], RunStartedEvent) and events[0].trace_id
    assert [e.call.call_id for e in of(events, ToolCallEvent)] == ["c1", "c2"]
    results = {e.result.call_id: e.result for e in of(events, ToolResultEvent)}
    assert not results["c1"].is_error and results["c2"].is_error and results["c2"].exit_code == 3
    assert both_started.is_set()
    finished = events[-1]
    assert isinstance(finished, RunFinishedEvent)
    assert (finished.stop_reason, finished.iterations, finished.final_text) == ("completed", 2, "One worked, one failed.")
    assert (finished.usage.input_tokens, finished.usage.output_tokens) == (300, 30)
    assert finished.trace_id == events[0].trace_id
    assert "".join(e.text for e in of(events, TextDeltaEvent)) == "Running both.One worked, one failed."

    # Results go back to the model in call order, the failure as a result.
    assert [(m["role"], m.get("tool_call_id")) for m in second["messages"][-3:]] == [
        ("assistant", None), ("tool", "c1"), ("tool", "c2")]
    assert second["messages"][-1]["content"] == "error: exit status 3"

    # Every step was saved on its own: user, assistant, each result, final answer.
    batches = [[(m.role, m.tool_call_id) for m in batch] for batch in transcripts.batches]
    assert batches[0] == [("user", "")] and batches[1] == [("assistant", "")]
    assert sorted(batches[2] + batches[3]) == [("tool", "c1"), ("tool", "c2")]
    assert batches[4] == [("assistant", "")] and len(batches) == 5
    assert transcripts.history["s1"][1].tool_calls[1].name == "failing"
    assert all(m.run_id == "r1" for m in transcripts.history["s1"])


async def test_max_iterations_then_one_toolless_summary(http, telemetry):
    tools = FakeTools({"echo": echo})
    transcripts = FakeTranscripts()
    steps = [reply("", tool_call("echo", {"i": i})) for i in range(2)] + [reply("I ran echo twice; more to do.")]
    with ScriptedLLMServer(steps) as llm:
        agent = make_agent(http, llm, tools, transcripts, telemetry)
        events = await collect(agent.start(TurnRequest("s1", "r1", "loop forever", max_iterations=2)))
        bodies = [r.body for r in llm.requests]

    finished = events[-1]
    assert (finished.stop_reason, finished.iterations) == ("max_iterations", 3)
    assert finished.final_text == "I ran echo twice; more to do."
    assert len(tools.calls) == 2
    assert [b["tool_choice"] for b in bodies] == ["auto", "auto", "none"]
    assert "Do not call any tools" in bodies[2]["messages"][-1]["content"]
    assert any("limit of 2 steps" in e.message for e in of(events, StatusEvent))
    # The summary instruction is not part of the transcript; the summary is.
    stored = transcripts.history["s1"]
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert stored[-1].content == finished.final_text and not stored[-1].tool_calls


async def test_cancel_in_the_middle_of_a_tool_call(http, telemetry):
    release = asyncio.Event()

    async def hang(call):
        await release.wait()
        return ok(call, "too late")

    tools = FakeTools({"hang": hang, "echo": echo})
    transcripts = FakeTranscripts()
    with ScriptedLLMServer([reply("", tool_call("echo", {}, id="fast"), tool_call("hang", {}, id="slow"))]) as llm:
        agent = make_agent(http, llm, tools, transcripts, telemetry)
        run = agent.start(TurnRequest("s1", "r1", "start something long"))
        events = await cancel_once(run, tools.started["hang"].wait(), timeout_s=5)

    assert tools.cancelled == ["slow"]
    assert isinstance(events[-1], RunFinishedEvent) and events[-1].stop_reason == "cancelled"
    stored = transcripts.history["s1"]
    assert [m.role for m in stored] == ["user", "assistant", "tool", "tool"]
    by_call = {m.tool_call_id: m.content for m in stored if m.role == "tool"}
    assert by_call["fast"].startswith("echo") and "cancelled" in by_call["slow"]
    spans = {s.name: s for s in telemetry.finished_spans()}
    assert spans["execute_tool hang"].status.status_code == StatusCode.ERROR
    assert spans["invoke_agent"].attributes["error.type"] == "cancelled"


async def test_a_consumer_that_goes_away_cancels_the_turn(http, telemetry):
    async def hang(call):
        await asyncio.Event().wait()

    tools = FakeTools({"hang": hang})
    transcripts = FakeTranscripts()
    with ScriptedLLMServer([reply("", tool_call("hang", {}, id="h"))]) as llm:
        agent = make_agent(http, llm, tools, transcripts, telemetry)
        run = agent.start(TurnRequest("s1", "r1", "go"))
        stream = run.events()
        async for event in stream:
            if isinstance(event, ToolCallEvent):
                break
        await asyncio.wait_for(tools.started["hang"].wait(), 5)
        await stream.aclose()  # what a cancelled RPC does to the servicer's generator

    assert tools.cancelled == ["h"]
    assert [m.role for m in transcripts.history["s1"]] == ["user", "assistant", "tool"]


async def test_model_unreachable_is_a_run_error_naming_the_url(http, telemetry):
    transcripts = FakeTranscripts()
    with ScriptedLLMServer([failure(503)] * 3) as llm:
        agent = make_agent(http, llm, FakeTools({}), transcripts, telemetry)
        events = await collect(agent.start(TurnRequest("s1", "r1", "hello")))
        url = llm.base_url

    statuses = [e.message for e in of(events, StatusEvent)]
    assert sum("retrying in" in s for s in statuses) == 2
    error = events[-1]
    assert isinstance(error, RunErrorEvent) and error.code == "UNAVAILABLE"
    assert url in error.message and KEY not in error.message
    assert [m.role for m in transcripts.history["s1"]] == ["user"]  # the user's message is kept
    chat = next(s for s in telemetry.finished_spans() if s.name == "chat test-model")
    assert chat.status.status_code == StatusCode.ERROR and chat.attributes["error.type"] == "UNAVAILABLE"


async def test_unknown_tool_and_bad_memory_arguments_come_back_as_error_results(http, telemetry):
    tools = FakeTools({"echo": echo})
    steps = [
        reply("", tool_call("no_such_tool", {}, id="u"), tool_call("memory_save", "{not json", id="m"),
              tool_call("memory_search", {"query": "x", "k": 99}, id="k"), tool_call("memory_save", {"text": " "}, id="e")),
        reply("noted"),
    ]
    with ScriptedLLMServer(steps) as llm:
        agent = make_agent(http, llm, tools, FakeTranscripts(), telemetry, memory=FakeMemory())
        events = await collect(agent.start(TurnRequest("s1", "r1", "try")))

    results = {e.result.call_id: e.result for e in of(events, ToolResultEvent)}
    assert results["u"].is_error and results["u"].error_kind == "not_found" and "echo" in results["u"].output
    assert results["m"].is_error and results["m"].error_kind == "invalid_arguments"
    # Checked against the tool's schema, which the answer quotes so the model can fix the call.
    assert results["k"].error_kind == "invalid_arguments" and "k: 99 is greater than the maximum of 20" in results["k"].output
    assert '"maximum":20' in results["k"].output
    assert results["e"].error_kind == "invalid_arguments" and "'text' is empty" in results["e"].output
    assert events[-1].stop_reason == "completed"
    assert tools.calls == []


async def test_a_tools_outage_leaves_the_memory_tools_and_a_status(http, telemetry):
    with ScriptedLLMServer([reply("I can only use memory now.")]) as llm:
        agent = make_agent(http, llm, FakeTools({}, catalog_down=True), FakeTranscripts(), telemetry, memory=FakeMemory())
        events = await collect(agent.start(TurnRequest("s1", "r1", "hi")))
        body = llm.requests[0].body
    assert any("tools service is unavailable" in e.message for e in of(events, StatusEvent))
    # The agent's own tools remain: compact, memory, the think scratchpad, the task board, delegation.
    assert [t["function"]["name"] for t in body["tools"]] == [
        "compact", "memory_save", "memory_search", "think", "task_create", "task_update", "task_get", "task_list",
        "delegate_task"]
    assert events[-1].stop_reason == "completed"


async def test_memory_tools_and_recall_use_the_session_namespace(http, telemetry):
    memory = FakeMemory(memories=[("team-a", "The deploy window is Tuesday at noon", "fact"),
                                  ("team-b", "The deploy window is Friday", "fact")])
    steps = [
        reply("", tool_call("memory_save", {"text": "Alice owns the deploy", "kind": "fact"}, id="s"),
              tool_call("memory_search", {"query": "deploy window", "k": 5}, id="q")),
        reply("Saved and found."),
    ]
    with ScriptedLLMServer(steps) as llm:
        agent = make_agent(http, llm, FakeTools({}), FakeTranscripts(), telemetry, memory=memory)
        events = await collect(agent.start(TurnRequest("s1", "r1", "when is the deploy window?", namespace="team-a")))
        system = llm.requests[0].body["messages"][0]["content"]

    assert "recalled 1 memory" in [e.message for e in of(events, StatusEvent)]
    assert "Tuesday at noon" in system and "Friday" not in system
    assert "Saturday, 21 November 2026" in system and "memory_search" in system
    results = {e.result.call_id: e.result for e in of(events, ToolResultEvent)}
    assert not results["s"].is_error and results["s"].data["namespace"] == "team-a"
    assert "Tuesday at noon" in results["q"].output and "Friday" not in results["q"].output
    assert ("team-a", "Alice owns the deploy", "fact") in memory.memories
    assert memory.searches[0] == ("team-a", "when is the deploy window?", 3)


async def test_memory_not_implemented_degrades_gracefully(http, telemetry):
    steps = [reply("", tool_call("memory_search", {"query": "anything"}, id="q")), reply("fine")]
    with ScriptedLLMServer(steps) as llm:
        agent = make_agent(http, llm, FakeTools({}), FakeTranscripts(), telemetry, memory=FakeMemory(unsupported=True))
        events = await collect(agent.start(TurnRequest("s1", "r1", "hi")))
    assert any("not available yet" in e.message for e in of(events, StatusEvent))
    result = of(events, ToolResultEvent)[0].result
    assert result.is_error and result.error_kind == "unavailable"
    assert events[-1].stop_reason == "completed"


async def test_history_is_replayed_and_repaired(http, telemetry):
    history = [
        ChatMessage("user", "earlier question"),
        ChatMessage("assistant", "", tool_calls=(ToolCall("old1", "echo", "{}"), ToolCall("old2", "echo", "{}"))),
        ChatMessage("tool", "second result first", tool_call_id="old2", name="echo"),
        # old1's result was lost in a crash; the next message is a new turn.
        ChatMessage("user", "are you there?"),
    ]
    with ScriptedLLMServer([reply("yes")]) as llm:
        agent = make_agent(http, llm, FakeTools({"echo": echo}), FakeTranscripts({"s1": history}), telemetry)
        await collect(agent.start(TurnRequest("s1", "r1", "hello again")))
        messages = llm.requests[0].body["messages"]
    assert [(m["role"], m.get("tool_call_id")) for m in messages[1:]] == [
        ("user", None), ("assistant", None), ("tool", "old1"), ("tool", "old2"), ("user", None), ("user", None)]
    assert "no result was recorded" in messages[3]["content"]


async def test_context_budget_drops_the_oldest_turns(http, telemetry):
    # The last-resort policy (compaction off; with it on, see test_agent_compaction.py).
    history = []
    for i in range(10):
        history += [ChatMessage("user", f"question {i} " + "x" * 1000), ChatMessage("assistant", f"answer {i}")]
    with ScriptedLLMServer([reply("ok")]) as llm:
        # Only the think tool is declared, so the budget is the messages' (the tools' schemas count too).
        agent = make_agent(http, llm, FakeTools({}), FakeTranscripts({"s1": history}), telemetry,
                           context_budget_chars=5000, compaction=False, task_modes=frozenset(),
                           subagent_modes=frozenset(), think_tool=False)
        await collect(agent.start(TurnRequest("s1", "r1", "latest")))
        messages = llm.requests[0].body["messages"]
    sent = "".join(json.dumps(m) for m in messages)
    assert "question 9" in sent and "question 0" not in sent and messages[-1]["content"] == "latest"
    assert "earlier messages of this conversation are left out" in messages[0]["content"]
    assert messages[1]["role"] == "user"  # whole turns dropped: nothing starts mid-turn


async def test_spans_and_metrics_follow_the_genai_conventions(http, telemetry):
    async def broken(call):
        return ToolOutcome(call_id=call.call_id, name=call.name, output="error: boom", is_error=True, error_kind="exit_status")

    tools = FakeTools({"echo": echo, "broken": broken})
    steps = [reply("", tool_call("echo", {}, id="e"), tool_call("broken", {}, id="b"), usage=(40, 4)),
             reply("done", usage=(60, 6), model="test-model-2026")]
    traced = http_client(10, 2, telemetry)  # the provider's client, instrumented as in the service
    with ScriptedLLMServer(steps) as llm:
        agent = make_agent(traced, llm, tools, FakeTranscripts(), telemetry)
        await collect(agent.start(TurnRequest("sess-9", "r1", "go")))
    await traced.aclose()

    spans = telemetry.finished_spans()
    root = next(s for s in spans if s.name == "invoke_agent")
    assert root.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert root.attributes["gen_ai.agent.name"] == "agentmesh"
    assert root.attributes["gen_ai.conversation.id"] == "sess-9"
    chats = [s for s in spans if s.name == "chat test-model"]
    assert len(chats) == 2 and all(s.parent.span_id == root.context.span_id for s in chats)
    assert chats[0].attributes["gen_ai.usage.input_tokens"] == 40
    assert chats[1].attributes["gen_ai.response.model"] == "test-model-2026"
    assert chats[0].attributes["gen_ai.provider.name"] == "openai"
    assert chats[0].attributes["gen_ai.request.model"] == "test-model"
    # The HTTP call to the model is a child of its chat span.
    http_spans = [s for s in spans if s.parent is not None and s.parent.span_id == chats[0].context.span_id]
    assert http_spans and http_spans[0].attributes.get("http.request.method", http_spans[0].attributes.get("http.method")) == "POST"
    # Both the older and the stable HTTP names, as the docs promise (observability.md).
    post = http_spans[0].attributes
    assert post["http.method"] == "POST" and post["http.status_code"] == post["http.response.status_code"] == 200
    assert post["http.url"] == post["url.full"] == f"{llm.base_url}/chat/completions"
    tools_spans = {s.name: s for s in spans if s.name.startswith("execute_tool")}
    assert tools_spans["execute_tool echo"].attributes["gen_ai.tool.call.id"] == "e"
    assert tools_spans["execute_tool echo"].status.status_code != StatusCode.ERROR
    assert tools_spans["execute_tool broken"].status.status_code == StatusCode.ERROR
    assert tools_spans["execute_tool broken"].attributes["gen_ai.tool.name"] == "broken"
    assert all(s.end_time for s in spans)

    tokens = telemetry.metric_points("gen_ai.client.token.usage")
    by_type = {kind: sum(p.sum for p in tokens if p.attributes["gen_ai.token.type"] == kind) for kind in ("input", "output")}
    assert by_type == {"input": 100, "output": 10}
    outcomes = {(p.attributes["tool"], p.attributes["outcome"]) for p in telemetry.metric_points("agentmesh.tool.duration")}
    assert outcomes == {("echo", "ok"), ("broken", "error")}
    assert [p.value for p in telemetry.metric_points("agentmesh.turns.in_flight")] == [0]


async def test_the_builtin_demo_script_drives_tools_and_memory(telemetry):
    async def write_file(call):
        return ok(call, "wrote notes.txt")

    async def read_file(call):
        return ok(call, "agentmesh runs ...")

    async def shell(call):
        return ok(call, "agentmesh runs ...\n90 notes.txt")

    from agentmesh.agent.providers.scripted import DEMO_SCRIPT

    memory = FakeMemory()
    tools = FakeTools({"write_file": write_file, "read_file": read_file, "shell": shell})
    agent = Agent(ScriptedProvider(DEMO_SCRIPT), tools, FakeTranscripts(), memory, AgentSettings(), model="scripted",
                  telemetry=telemetry, capabilities=for_turn)
    events = await collect(agent.start(TurnRequest("demo", "r1", "write a note and remember it")))
    names = [e.call.name for e in of(events, ToolCallEvent)]
    assert names == ["write_file", "read_file", "shell", "memory_save", "memory_search"]
    assert not any(e.result.is_error for e in of(events, ToolResultEvent))
    search = [e.result for e in of(events, ToolResultEvent) if e.result.name == "memory_search"][0]
    assert "notes.txt" in search.output
    assert events[-1].stop_reason == "completed" and "notes.txt" in events[-1].final_text


@pytest.mark.parametrize("max_iterations", [1])
async def test_a_scripted_turn_without_replies_left_still_finishes(telemetry, max_iterations):
    agent = Agent(ScriptedProvider({"turns": [{"match": "nothing-matches", "replies": []}]}), FakeTools({}),
                  FakeTranscripts(), None, AgentSettings(), model="scripted", telemetry=telemetry, capabilities=for_turn)
    events = await collect(agent.start(TurnRequest("s", "r", "hello", max_iterations=max_iterations)))
    assert events[-1].stop_reason == "completed" and "no more replies" in events[-1].final_text


async def test_the_api_key_never_reaches_events_or_logs(http, telemetry):
    from structlog.testing import capture_logs

    steps = [failure(401, message=f"Incorrect API key provided: {KEY}")]
    with ScriptedLLMServer(steps) as llm, capture_logs() as logs:
        agent = make_agent(http, llm, FakeTools({}), FakeTranscripts(), telemetry)
        events = await collect(agent.start(TurnRequest("s1", "r1", "hi")))
        assert llm.requests[0].headers["authorization"] == f"Bearer {KEY}"  # it was sent, in a header
    assert events[-1].code == "UNAUTHENTICATED" and "refused the API key" in events[-1].message
    assert logs and any(entry.get("code") == "UNAUTHENTICATED" for entry in logs)
    assert KEY not in repr(events) and KEY not in repr(logs)
    assert not any(KEY in repr(dict(s.attributes)) + repr(s.events) for s in telemetry.finished_spans())


async def test_a_turn_may_choose_its_model_and_system_prompt(http, telemetry):
    with ScriptedLLMServer([reply("hi")]) as llm:
        agent = make_agent(http, llm, FakeTools({}), FakeTranscripts(), telemetry)
        await collect(agent.start(TurnRequest("s1", "r1", "hi", model="other-model", system_prompt="Talk like a pirate.")))
        body = llm.requests[0].body
    assert body["model"] == "other-model"
    assert body["messages"][0]["content"].startswith("Talk like a pirate.")
    assert [s.name for s in telemetry.finished_spans() if s.name.startswith("chat")] == ["chat other-model"]


async def test_cancel_during_the_model_call_closes_it(http, telemetry):
    transcripts = FakeTranscripts()
    with ScriptedLLMServer([reply("too slow", delay_s=30)]) as llm:
        agent = make_agent(http, llm, FakeTools({}), transcripts, telemetry)
        run = agent.start(TurnRequest("s1", "r1", "think hard"))
        events = await cancel_once(run, asyncio.to_thread(llm.wait_for_requests, 1, 10), timeout_s=10)  # far less than the model's 30 s
    assert events[-1].stop_reason == "cancelled" and events[-1].iterations == 1
    assert [m.role for m in transcripts.history["s1"]] == ["user"]
    chat = next(s for s in telemetry.finished_spans() if s.name.startswith("chat"))
    assert chat.attributes["error.type"] == "cancelled"


async def test_calls_beyond_the_per_reply_cap_are_refused_not_run(http, telemetry):
    tools = FakeTools({"echo": echo})
    calls = [tool_call("echo", {"i": i}, id=f"c{i}") for i in range(4)]
    with ScriptedLLMServer([reply("", *calls), reply("ok")]) as llm:
        agent = make_agent(http, llm, tools, FakeTranscripts(), telemetry, max_tool_calls=2)
        events = await collect(agent.start(TurnRequest("s1", "r1", "spam")))
        tool_messages = [m for m in llm.requests[1].body["messages"] if m["role"] == "tool"]
    assert [c.call_id for c in tools.calls] == ["c0", "c1"]
    results = {e.result.call_id: e.result for e in of(events, ToolResultEvent)}
    assert [results[f"c{i}"].error_kind for i in range(4)] == ["", "", "too_many_calls", "too_many_calls"]
    assert [m["tool_call_id"] for m in tool_messages] == ["c0", "c1", "c2", "c3"]
