"""Compaction: older turns summarised by the model (a real OpenAI-protocol server), the summary
kept in the transcript and reused, and every failure falling back to the plain budget policy."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import Sequence

import pytest
from opentelemetry.trace import StatusCode

from agentmesh.agent.capabilities import compaction
from agentmesh.agent.capabilities.registry import for_turn
from agentmesh.agent.loop import context
from agentmesh.agent.loop.run import Agent, TurnRequest
from agentmesh.agent.loop.window import ContextBudget
from agentmesh.agent.providers import OpenAIProvider, RetryPolicy
from agentmesh.agent.settings import AgentSettings
from agentmesh.agent.types import ChatMessage, RunFinishedEvent, StatusEvent, TextDeltaEvent, ToolCall
from agentmesh.errors import Unavailable
from tests.agent.agent_fakes import FakeTools, FakeTranscripts, cancel_once
from tests.support.llm_server import ScriptedLLMServer, drop, failure, reply

NOW = dt.datetime(2026, 11, 21, 12, 30, tzinfo=dt.UTC)
# Compact past 7 500 characters of history, keep 2 500; the budget itself is roomy unless a test
# wants the budget policy to drop turns too.
COMPACTION = {"context_budget_chars": 40_000, "compact_at_chars": 7_500, "compact_keep_chars": 2_500}


class NumberedTranscripts(FakeTranscripts):
    """Assigns seq like the memory service does (1-based position), so coverage is by real seqs."""

    async def append(self, session_id: str, messages: Sequence[ChatMessage]) -> None:
        start = len(self.history.get(session_id, []))
        numbered = [ChatMessage(**{**vars(m), "seq": start + i + 1}) for i, m in enumerate(messages)]
        await super().append(session_id, numbered)


def make_agent(http, llm, transcripts, telemetry, **overrides) -> Agent:
    settings = AgentSettings(**{"retry_base_s": 0.01, "recall_k": 0, **COMPACTION, **overrides})
    provider = OpenAIProvider(http, llm.base_url, "", RetryPolicy(max_retries=2, base_s=0.01))
    return Agent(provider, FakeTools({}), transcripts, None, settings, model="test-model", telemetry=telemetry,
                 capabilities=for_turn, clock=lambda: NOW)


def chat_history(turns: int, start: int = 0, size: int = 800) -> list[ChatMessage]:
    messages = []
    for i in range(start, start + turns):
        messages += [ChatMessage("user", f"question {i} " + "q" * size), ChatMessage("assistant", f"answer {i}")]
    return messages


async def stored(history: list[ChatMessage]) -> NumberedTranscripts:
    transcripts = NumberedTranscripts()
    await transcripts.append("s1", history)
    return transcripts


async def run_turn(agent: Agent, message: str, run_id: str = "r1") -> list:
    return [e async for e in agent.start(TurnRequest("s1", run_id, message)).events()]


def statuses(events) -> list[str]:
    return [e.message for e in events if isinstance(e, StatusEvent)]


def is_summary_request(body) -> bool:
    return body["messages"][0]["content"] == compaction.INSTRUCTION


async def test_a_long_history_is_summarised_once_and_the_summary_reused(http, telemetry):
    transcripts = await stored(chat_history(10))  # ~8 500 chars, over the 7 500 threshold
    steps = [reply("SUMMARY: the user asked questions 0 to 7.", usage=(500, 50)), reply("fine", usage=(100, 10)),
             reply("again", usage=(120, 12))]
    with ScriptedLLMServer(steps) as llm:
        agent = make_agent(http, llm, transcripts, telemetry)
        events = await run_turn(agent, "latest")
        second = await run_turn(agent, "next", run_id="r2")
        bodies = [r.body for r in llm.requests]

    # Exactly one summarising call: tool-less, with its instruction and the old turns only.
    assert [is_summary_request(b) for b in bodies] == [True, False, False]
    summarising = bodies[0]
    assert "tools" not in summarising and len(summarising["messages"]) == 2
    assert "Open items" in summarising["messages"][0]["content"]
    asked = summarising["messages"][1]["content"]
    assert "question 0 " in asked and "question 7 " in asked and "question 8 " not in asked

    # The next call sees [system, summary, the kept turns verbatim, the new message].
    messages = bodies[1]["messages"]
    assert [m["role"] for m in messages] == ["system", "system", "user", "assistant", "user", "assistant", "user"]
    assert messages[1]["content"].endswith("SUMMARY: the user asked questions 0 to 7.")
    assert messages[2]["content"].startswith("question 8 ") and messages[-1]["content"] == "latest"
    assert "question 0 " not in json.dumps(messages)
    assert "left out" not in messages[0]["content"]

    # Users see it; the summary text is not streamed as the answer; usage counts the summary call.
    assert any(s.startswith("compacted 16 earlier messages into a summary") for s in statuses(events))
    assert "".join(e.text for e in events if isinstance(e, TextDeltaEvent)) == "fine"
    finished = events[-1]
    assert isinstance(finished, RunFinishedEvent) and finished.stop_reason == "completed"
    assert (finished.usage.input_tokens, finished.usage.output_tokens) == (600, 60)
    assert finished.iterations == 1  # the turn's own model calls

    # Durable: one summary entry in the transcript, after the user message, covering seqs 1-16.
    entries = transcripts.history["s1"]
    summaries = [m for m in entries if m.kind == "summary"]
    assert len(summaries) == 1 and len(entries) == 25  # 20 old, 3 of the first turn, 2 of the second
    assert (summaries[0].role, summaries[0].covers_through_seq, summaries[0].seq) == ("system", 16, 22)
    assert entries[20].content == "latest"

    # The next turn reuses it: one model call, summary first, the old turns still out.
    assert not any("compacted" in s for s in statuses(second)) and second[-1].final_text == "again"
    replayed = bodies[2]["messages"]
    assert replayed[1]["content"] == messages[1]["content"]
    assert [m.get("content") for m in replayed[-3:]] == ["latest", "fine", "next"]
    assert (second[-1].usage.input_tokens, second[-1].usage.output_tokens) == (120, 12)


async def test_compaction_is_traced_and_counted(http, telemetry):
    transcripts = await stored(chat_history(10))
    with ScriptedLLMServer([reply("short summary", usage=(300, 30)), reply("ok", usage=(40, 4))]) as llm:
        await run_turn(make_agent(http, llm, transcripts, telemetry), "latest")

    spans = telemetry.finished_spans()
    root = next(s for s in spans if s.name == "invoke_agent")
    compact = next(s for s in spans if s.name == "compact_context")
    assert compact.parent.span_id == root.context.span_id
    assert compact.attributes["agentmesh.compaction.messages"] == 16
    assert compact.attributes["agentmesh.compaction.covers_through_seq"] == 16
    chats = [s for s in spans if s.name == "chat test-model"]
    summary_chat = next(s for s in chats if s.attributes.get("agentmesh.compaction"))
    assert summary_chat.parent.span_id == compact.context.span_id
    assert summary_chat.attributes["gen_ai.usage.input_tokens"] == 300
    assert len(chats) == 2
    tokens = telemetry.metric_points("gen_ai.client.token.usage")
    assert sum(p.sum for p in tokens if p.attributes["gen_ai.token.type"] == "input") == 340


@pytest.mark.parametrize("broken", [[failure(500)] * 3, [drop()] * 3], ids=["http-500", "dropped"])
async def test_a_failing_summary_falls_back_to_dropping(http, telemetry, broken):
    transcripts = await stored(chat_history(12))  # ~10 200 chars: over a 10 000 budget
    with ScriptedLLMServer([*broken, reply("done anyway")]) as llm:
        events = await run_turn(make_agent(http, llm, transcripts, telemetry, context_budget_chars=10_000), "latest")
        last = llm.requests[-1].body

    assert len(llm.requests) == 4  # three attempts at the summary, then the turn's own call
    notes = statuses(events)
    assert any(n.startswith("could not summarise earlier messages") and "leaving the oldest messages out" in n for n in notes)
    assert events[-1].stop_reason == "completed" and events[-1].final_text == "done anyway"
    assert "earlier messages of this conversation are left out" in last["messages"][0]["content"]
    assert last["messages"][1]["role"] == "user" and last["messages"][-1]["content"] == "latest"
    assert not [m for m in transcripts.history["s1"] if m.kind == "summary"]
    compact = next(s for s in telemetry.finished_spans() if s.name == "compact_context")
    assert compact.status.status_code == StatusCode.ERROR


async def test_compaction_off_keeps_the_plain_budget_policy(http, telemetry):
    old_summary = ChatMessage("system", "an old summary", kind="summary", covers_through_seq=20)
    transcripts = await stored([*chat_history(12), old_summary])
    with ScriptedLLMServer([reply("ok")]) as llm:
        agent = make_agent(http, llm, transcripts, telemetry, compaction=False, context_budget_chars=10_000)
        events = await run_turn(agent, "latest")
        messages = llm.requests[0].body["messages"]

    assert len(llm.requests) == 1 and events[-1].stop_reason == "completed"
    sent = json.dumps(messages)
    assert "question 11 " in sent and "question 0 " not in sent and "an old summary" not in sent
    assert "earlier messages of this conversation are left out" in messages[0]["content"]
    assert not any("compact" in s for s in statuses(events))


async def test_cancelling_during_the_summary_cancels_the_turn(http, telemetry):
    transcripts = await stored(chat_history(10))
    with ScriptedLLMServer([reply("too slow", delay_s=30)]) as llm:
        run = make_agent(http, llm, transcripts, telemetry).start(TurnRequest("s1", "r1", "latest"))
        events = await cancel_once(run, asyncio.to_thread(llm.wait_for_requests, 1, 10), timeout_s=10)

    assert isinstance(events[-1], RunFinishedEvent) and events[-1].stop_reason == "cancelled"
    assert [m.content for m in transcripts.history["s1"][20:]] == ["latest"]  # no summary saved
    chat = next(s for s in telemetry.finished_spans() if s.name == "chat test-model")
    assert chat.attributes["agentmesh.compaction"] and chat.attributes["error.type"] == "cancelled"


def tool_turn(i: int, output_chars: int) -> list[ChatMessage]:
    calls = (ToolCall(f"a{i}", "read_file", '{"path": "a.txt"}'), ToolCall(f"b{i}", "shell", '{"command": "ls"}'))
    return [
        ChatMessage("user", f"task {i}"),
        ChatMessage("assistant", "", tool_calls=calls[:1]),
        ChatMessage("tool", "A" * output_chars, tool_call_id=f"a{i}", name="read_file"),
        ChatMessage("assistant", "", tool_calls=calls[1:]),
        ChatMessage("tool", "B" * output_chars, tool_call_id=f"b{i}", name="shell"),
        ChatMessage("assistant", f"did task {i}"),
    ]


def pairs_intact(messages: list) -> bool:
    """Every tool result directly follows the assistant message (or results) of its call."""
    open_calls: set[str] = set()
    for m in messages:
        role = m["role"] if isinstance(m, dict) else m.role
        if role == "tool":
            call_id = m["tool_call_id"] if isinstance(m, dict) else m.tool_call_id
            if call_id not in open_calls:
                return False
            open_calls.discard(call_id)
        else:
            if open_calls:
                return False
            calls = (m.get("tool_calls") or []) if isinstance(m, dict) else m.tool_calls
            open_calls = {c["id"] if isinstance(c, dict) else c.call_id for c in calls}
    return not open_calls


@pytest.mark.parametrize("keep_chars", range(0, 6000, 250))
def test_the_plan_never_splits_a_tool_call_from_its_result(keep_chars):
    history = context.model_view([m for i in range(4) for m in tool_turn(i, 600)], use_summaries=True)
    todo = compaction.plan(history, threshold_chars=100, keep_chars=keep_chars, tool_output_chars=16_000)
    if todo is None:  # everything fits in what is kept: nothing to compact
        assert sum(context.size_of(m) for m in history) <= keep_chars
        return
    assert todo.old and todo.old + todo.kept == history
    assert pairs_intact(todo.kept) and pairs_intact(todo.old)
    assert not todo.kept or todo.kept[0].role == "user"
    assert todo.covers_through_seq == todo.old[-1].seq
    assert sum(context.size_of(m) for m in todo.kept) <= keep_chars


async def test_tool_turns_are_compacted_whole(http, telemetry):
    # The newest turn (~3 100 chars) does not fit the 2 500 kept: it is summarised whole, not split.
    transcripts = await stored([m for i in range(4) for m in tool_turn(i, 1500)])
    with ScriptedLLMServer([reply("they ran tasks 0-3"), reply("ok")]) as llm:
        await run_turn(make_agent(http, llm, transcripts, telemetry), "latest")
        asked = llm.requests[0].body["messages"][1]["content"]
        messages = llm.requests[1].body["messages"]

    assert "[tool call read_file" in asked and "[tool result shell]" in asked and "did task 3" in asked
    assert [m["role"] for m in messages] == ["system", "system", "user"]
    assert pairs_intact(messages)


async def test_an_earlier_summary_is_folded_into_the_next(http, telemetry):
    first = ChatMessage("system", "Summary …\n\nUser is Ada; wants a report.", kind="summary", covers_through_seq=20)
    transcripts = await stored([*chat_history(10), first, *chat_history(10, start=10)])
    with ScriptedLLMServer([reply("Ada's report: questions 0-17 answered."), reply("ok")]) as llm:
        await run_turn(make_agent(http, llm, transcripts, telemetry), "latest")
        asked = llm.requests[0].body["messages"][1]["content"]
        messages = llm.requests[1].body["messages"]

    assert asked.startswith("Earlier summary:\nSummary …\n\nUser is Ada; wants a report.")
    assert "question 10 " in asked and "question 9 " not in asked
    assert messages[1]["content"].endswith("Ada's report: questions 0-17 answered.")
    assert messages[2]["content"].startswith("question 18 ")
    newest = [m for m in transcripts.history["s1"] if m.kind == "summary"][-1]
    assert newest.covers_through_seq == 37  # seq 21 is the first summary; question 17's answer is 37


async def test_a_history_too_big_for_one_call_is_summarised_in_passes(http, telemetry):
    # ~24 000 characters of old turns; with a 10 000 budget one summary request holds ~5 200.
    transcripts = await stored(chat_history(30))

    def answer(request):
        n = len(llm.requests)
        return reply(f"summary after pass {n}") if is_summary_request(request.body) else reply("ok")

    with ScriptedLLMServer(default=answer) as llm:
        agent = make_agent(http, llm, transcripts, telemetry, context_budget_chars=10_000)
        events = await run_turn(agent, "latest")
        bodies = [r.body for r in llm.requests]

    passes = len(bodies) - 1
    assert passes == compaction.MAX_PASSES and [is_summary_request(b) for b in bodies] == [True] * passes + [False]
    assert all(len(json.dumps(b)) < 10_000 for b in bodies[:passes])
    assert "Earlier summary" not in bodies[0]["messages"][1]["content"]
    for i in range(1, passes):
        assert bodies[i]["messages"][1]["content"].startswith(f"Earlier summary:\nsummary after pass {i}")
    # Four passes do not hold it all: the oldest messages are said to be left out, the rest covered.
    assert "12 even older messages were too many to summarise" in bodies[0]["messages"][1]["content"]
    asked = "".join(b["messages"][1]["content"] for b in bodies[:passes])
    assert "question 5 " not in asked and "question 6 " in asked and "question 27 " in asked
    assert bodies[passes]["messages"][1]["content"].endswith(f"summary after pass {passes}")
    assert events[-1].stop_reason == "completed"


async def test_a_store_without_seqs_is_numbered_by_position(http, telemetry):
    transcripts = FakeTranscripts({"s1": chat_history(10)})  # an in-process store: seq stays 0
    with ScriptedLLMServer([reply("summary"), reply("one"), reply("two")]) as llm:
        agent = make_agent(http, llm, transcripts, telemetry)
        await run_turn(agent, "latest")
        await run_turn(agent, "next", run_id="r2")
        bodies = [r.body for r in llm.requests]
    assert [is_summary_request(b) for b in bodies] == [True, False, False]
    assert [m.get("content") for m in bodies[2]["messages"][2:]] == [
        bodies[1]["messages"][2]["content"], "answer 8", bodies[1]["messages"][4]["content"], "answer 9",
        "latest", "one", "next"]


def test_model_view_uses_the_latest_summary():
    entries = [*chat_history(3), ChatMessage("system", "S1", kind="summary", covers_through_seq=2),
               *chat_history(2, start=3), ChatMessage("system", "S2", kind="summary", covers_through_seq=6)]
    view = context.model_view(entries, use_summaries=True)
    assert [m.content[:10] for m in view] == ["S2", "question 3", "answer 3", "question 4", "answer 4"]
    assert [m.seq for m in view] == [12, 8, 9, 10, 11]
    assert all(m.kind != "summary" for m in context.model_view(entries, use_summaries=False))
    assert context.model_view(chat_history(1), use_summaries=True)[1].seq == 2


def test_fit_keeps_the_summary_when_it_must_drop_turns():
    summary = ChatMessage("system", "the summary", kind="summary", covers_through_seq=4)
    kept, _, omitted = context.fit("sys", [summary, *chat_history(5)], [ChatMessage("user", "now")],
                                   budget_chars=2000, tool_output_chars=500)
    assert kept[0] is summary and omitted == 6 and kept[1].content.startswith("question 3 ")


def budget_of(settings: AgentSettings, window: int = 131_072) -> ContextBudget:
    return ContextBudget.of(window, max_tokens=settings.max_tokens, chars_per_token=4.0,
                            cap_chars=settings.context_budget_chars, compact_at_chars=settings.compact_at_chars,
                            compact_keep_chars=settings.compact_keep_chars)


def test_settings_from_env():
    s = AgentSettings.from_env({"AGENTMESH_AGENT_COMPACTION": "false", "AGENTMESH_AGENT_COMPACT_AT_CHARS": "5000",
                                "AGENTMESH_AGENT_COMPACT_KEEP_CHARS": "4000"})
    b = budget_of(s)
    assert (s.compaction, b.threshold_chars, b.keep_chars) == (False, 5000, 2500)
    d = budget_of(AgentSettings.from_env({"AGENTMESH_AGENT_CONTEXT_BUDGET_CHARS": "100000"}))
    assert (d.chars, d.threshold_chars, d.keep_chars) == (100_000, 75_000, 25_000)
    # Without a cap, the model's window decides: 8192 tokens less an eighth for the answer.
    small = budget_of(AgentSettings.from_env({}), window=8192)
    assert (small.request_tokens, small.chars) == (7168, int(7168 * 4.0 * 0.9))


class SummaryRefusingTranscripts(NumberedTranscripts):
    async def append(self, session_id: str, messages: Sequence[ChatMessage]) -> None:
        if any(m.kind == "summary" for m in messages):
            raise Unavailable("the memory service at 127.0.0.1:1 is not answering")
        await super().append(session_id, messages)


async def test_a_summary_that_cannot_be_saved_still_serves_the_turn(http, telemetry):
    transcripts = SummaryRefusingTranscripts()
    await transcripts.append("s1", chat_history(10))
    with ScriptedLLMServer([reply("the summary"), reply("ok"), reply("summary again"), reply("ok again")]) as llm:
        agent = make_agent(http, llm, transcripts, telemetry)
        events = await run_turn(agent, "latest")
        await run_turn(agent, "next", run_id="r2")
        bodies = [r.body for r in llm.requests]

    assert any(s.startswith("could not save the summary") for s in statuses(events))
    assert events[-1].stop_reason == "completed"
    assert bodies[1]["messages"][1]["content"].endswith("the summary")
    assert [is_summary_request(b) for b in bodies] == [True, False, True, False]  # made again next turn


def test_a_first_compaction_uses_the_room_no_earlier_summary_takes():
    settings = budget_of(AgentSettings(context_budget_chars=10_000))
    old = [ChatMessage("user", "x" * 1000) for _ in range(6)]  # ~6 000 characters rendered
    sized_for_a_summary = compaction.passes(old, compaction.pass_chars(settings))[0]
    first_time = compaction.passes(old, compaction.pass_chars(settings),
                                   first_limit_chars=compaction.pass_chars(settings, running_summary_chars=0))[0]
    assert [len(g) for g in sized_for_a_summary] == [5, 1]  # room kept for a full-size earlier summary
    assert [len(g) for g in first_time] == [6]  # there is none: one summary call does it
