"""Thinking: the `think` scratchpad tool, and reasoning models emit (OpenAI `reasoning_content`
deltas, `<think>…</think>` in the content) streamed as `reasoning_delta` events, kept out of the
answer and, unless configured, out of what is stored and sent back. Over real gRPC against the
scripted OpenAI-protocol server; the splitter also on its own, over every way to cut a stream."""

from __future__ import annotations

import random

from agentmesh.agent.providers.reasoning import ThinkSplitter
from agentmesh.agent.types import ReasoningChunk, TextChunk
from tests.agent.test_agent_finishing import Running, finished, of_kind, run_turn
from tests.agent.test_agent_service import stored
from tests.support.llm_server import reply, tool_call


def two_steps(first):
    """`first` answers the first call; the second call (after a tool result) gets a plain answer."""

    def model(request):
        if any(m["role"] == "tool" for m in request.messages):
            return reply("Done.")
        return first

    return model


async def test_reasoning_content_streams_as_its_own_event_and_stays_out_of_the_context(tmp_path):
    first = reply("Let me look.", tool_call("shell", {"command": "echo hi"}), reasoning="The user wants hi; shell it.")
    async with Running(tmp_path, two_steps(first)) as running:
        events = await run_turn(running.stack, "rc", "say hi")
        second = running.llm.requests[1]
        messages = await stored(running.stack, "rc")
    assert "".join(r.text for r in of_kind(events, "reasoning_delta")) == "The user wants hi; shell it."
    assert "".join(d.text for d in of_kind(events, "text_delta")) == "Let me look.Done."
    assert finished(events).final_text == "Done."
    # Neither sent back to the model nor stored.
    assert all("shell it" not in (m.get("content") or "") for m in second.messages)
    assert all("shell it" not in m.content for m in messages)


async def test_think_tags_in_the_content_are_split_off_even_across_chunks(tmp_path):
    answer = reply("<think>2 and 2: four.</think>\n\nIt is 4.", chunk_chars=3)
    async with Running(tmp_path, lambda request: answer) as running:
        events = await run_turn(running.stack, "tags", "what is 2+2?")
        messages = await stored(running.stack, "tags")
    assert "".join(r.text for r in of_kind(events, "reasoning_delta")) == "2 and 2: four."
    assert "".join(d.text for d in of_kind(events, "text_delta")) == "It is 4."
    assert finished(events).final_text == "It is 4."
    assert [m.content for m in messages if m.role == "assistant"] == ["It is 4."]


async def test_kept_reasoning_is_stored_and_sent_back(tmp_path):
    first = reply("Let me look.", tool_call("shell", {"command": "echo hi"}), reasoning="Shell it.")
    async with Running(tmp_path, two_steps(first), keep_reasoning="true") as running:
        events = await run_turn(running.stack, "keep", "say hi")
        second = running.llm.requests[1]
    assert "".join(d.text for d in of_kind(events, "text_delta")) == "Let me look.Done."
    sent = [m for m in second.messages if m["role"] == "assistant"]
    assert sent[0]["content"] == "<think>\nShell it.\n</think>\nLet me look."


async def test_the_think_tool_records_a_thought_and_does_nothing_else(tmp_path):
    first = reply("", tool_call("think", {"thought": "Check the file first, then answer."}, id="t1"))
    async with Running(tmp_path, two_steps(first)) as running:
        events = await run_turn(running.stack, "think", "help")
        tools = [t["function"]["name"] for t in running.llm.requests[0].body["tools"]]
        messages = await stored(running.stack, "think")
        workspace = running.stack.settings.home / "workspaces" / "think"
    assert "think" in tools
    result = of_kind(events, "tool_result")[0].result
    assert (result.name, result.is_error, result.output) == ("think", False, "Thought noted. Carry on.")
    # Recorded: the thought is in the transcript as the call's arguments, with its result.
    assert "Check the file first" in messages[1].tool_calls[0].arguments_json
    assert (messages[2].role, messages[2].tool_call_id) == ("tool", "t1")
    assert not workspace.exists() or not any(workspace.iterdir())  # no effects: nothing ran in a sandbox


async def test_without_the_think_tool_it_is_not_offered(tmp_path):
    first = reply("", tool_call("think", {"thought": "hmm"}))
    async with Running(tmp_path, two_steps(first), think_tool="false") as running:
        events = await run_turn(running.stack, "nothink", "help")
        tools = [t["function"]["name"] for t in running.llm.requests[0].body["tools"]]
    assert "think" not in tools
    assert of_kind(events, "tool_result")[0].result.error_kind == "not_found"


def test_the_splitter_gives_the_same_pieces_however_the_stream_is_cut():
    text = "<think>first <b>thought</b></think>\n\nanswer < 3 and <think>second</think>the end</thin"
    rng = random.Random(7)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, 12)))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        splitter = ThinkSplitter()
        out = [p for piece in pieces for p in splitter.feed(piece)] + splitter.flush()
        reasoning = "".join(p.text for p in out if isinstance(p, ReasoningChunk))
        answer = "".join(p.text for p in out if isinstance(p, TextChunk))
        assert reasoning == "first <b>thought</b>second"
        assert answer == "answer < 3 and the end</thin"
