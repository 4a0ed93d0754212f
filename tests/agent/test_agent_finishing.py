"""A loop that finishes well, over real gRPC: the agent, memory and tools services on real ports,
the model a scripted OpenAI-protocol HTTP server. Each mechanism is also run switched off (its
setting 0), to show the test would catch its absence."""

from __future__ import annotations

import json

import pytest

from agentmesh.agent.capabilities.guards import trim_old_tool_results
from agentmesh.agent.types import ChatMessage
from agentmesh.internal.v1 import agent_service_pb2
from agentmesh.v1 import gateway_pb2
from tests.agent.test_agent_service import SERVICES, agent_stub, open_session, stored
from tests.support.llm_server import ScriptedLLMServer, reply, tool_call
from tests.support.stack import Stack

QUIET = {"AGENTMESH_AGENT_RECALL_K": "0"}


async def run_turn(stack: Stack, session_id: str, message: str, **options) -> list:
    await open_session(stack, session_id)
    request = agent_service_pb2.RunTurnRequest(session_id=session_id, message=message,
                                       options=gateway_pb2.ChatOptions(**options))
    return [e async for e in agent_stub(stack).RunTurn(iter([request]), timeout=60)]


def of_kind(events, kind: str) -> list:
    return [getattr(e, kind) for e in events if e.WhichOneof("payload") == kind]


def statuses(events) -> list[str]:
    return [s.message for s in of_kind(events, "status")]


def finished(events):
    assert events[-1].WhichOneof("payload") == "run_finished", events[-1]
    return events[-1].run_finished


class Running:
    """A scripted model server and the three services, with agent settings for this test."""

    def __init__(self, tmp_path, model, env=None, **settings):
        self.llm = ScriptedLLMServer(default=model)
        env = {**QUIET, **(env or {}), **{f"AGENTMESH_AGENT_{k.upper()}": str(v) for k, v in settings.items()}}
        self.home = tmp_path / "home"
        self.env = env

    async def __aenter__(self):
        self.llm.start()
        self.stack = Stack(self.home, llm_base_url=self.llm.base_url, env=self.env, services=SERVICES)
        await self.stack.start()
        return self

    async def __aexit__(self, *exc):
        await self.stack.stop()
        self.llm.close()


# --- continuation of a reply cut off by the output limit --------------------------------------


def cut_twice(request):
    """A long answer the server cuts off twice."""
    last = request.messages[-1]
    if last["role"] == "system" and "cut off" in last["content"]:
        partial = request.messages[-2]["content"]
        if partial == "The first third, ":
            return reply("the second third, ", finish_reason="length")
        return reply("and the end.")
    return reply("The first third, ", finish_reason="length")


async def test_a_reply_cut_off_by_the_output_limit_is_continued_and_stitched(tmp_path):
    async with Running(tmp_path, cut_twice) as running:
        events = await run_turn(running.stack, "cut", "write a long answer")
        requests = running.llm.requests
        messages = await stored(running.stack, "cut")
    assert finished(events).final_text == "The first third, the second third, and the end."
    assert finished(events).stop_reason == "completed" and finished(events).iterations == 3
    # The user saw one continuous text; the transcript holds one assistant message.
    assert "".join(d.text for d in of_kind(events, "text_delta")) == "The first third, the second third, and the end."
    assert [(m.role, m.content) for m in messages] == [
        ("user", "write a long answer"), ("assistant", "The first third, the second third, and the end.")]
    # Each continuation sends the text so far as the assistant's, then the note to go on.
    assert requests[2].messages[-2] == {"role": "assistant", "content": "The first third, the second third, "}
    assert sum("continuing it" in s for s in statuses(events)) == 2


async def test_continuation_is_bounded(tmp_path):
    async with Running(tmp_path, lambda request: reply("more ", finish_reason="length"), max_continuations=2) as running:
        events = await run_turn(running.stack, "bounded", "never ends")
        count = len(running.llm.requests)
    assert count == 3 and finished(events).final_text == "more more more "
    assert any("still cut off after 2 continuations" in s for s in statuses(events))


async def test_without_continuation_the_cut_off_reply_is_the_answer(tmp_path):
    async with Running(tmp_path, cut_twice, max_continuations=0) as running:
        events = await run_turn(running.stack, "off", "write a long answer")
    assert finished(events).final_text == "The first third, "


# --- the wrap-up hint before the step budget --------------------------------------------------


def counting_shell(request):
    """A tool call with new arguments every step, so nothing else intervenes; a summary when told."""
    if request.body.get("tool_choice") == "none":
        return reply("Summary: counted.")
    n = sum(1 for m in request.messages if m["role"] == "tool")
    return reply("", tool_call("shell", {"command": f"echo step {n}"}))


def wrap_up_notes(request) -> list[str]:
    return [m["content"] for m in request.messages if m["role"] == "system" and m["content"].startswith("Wrap up:")]


@pytest.mark.parametrize("window", [2, 0])
async def test_the_model_is_told_to_wrap_up_before_the_step_budget(tmp_path, window):
    async with Running(tmp_path, counting_shell, wrap_up_steps=window) as running:
        events = await run_turn(running.stack, "wrap", "count", max_iterations=5)
        requests = running.llm.requests
    assert finished(events).stop_reason == "max_iterations" and len(requests) == 6
    notes = [wrap_up_notes(r) for r in requests]
    if window == 0:
        assert notes == [[]] * 6
        return
    assert notes[:3] == [[], [], []]
    assert notes[3] == ["Wrap up: 2 of your 5 tool-using steps are left, this one included. Finish the essential "
                        "work now and end with your answer; after that, no more tools can be called."]
    assert notes[4][0].startswith("Wrap up: 1 of your 5 tool-using steps is left")
    assert "2 of 5 steps left: asking the model to wrap up" in statuses(events)


# --- trimming old tool results in what is sent ------------------------------------------------


def big_outputs(request):
    n = sum(1 for m in request.messages if m["role"] == "tool")
    if n == 5:
        return reply("Done reading.")
    return reply("", tool_call("shell", {"command": f"printf 'chunk{n}-%03000d' 0"}))


@pytest.mark.parametrize("keep", [2, 0])
async def test_old_tool_results_are_trimmed_in_what_is_sent_but_kept_in_the_transcript(tmp_path, keep):
    async with Running(tmp_path, big_outputs, keep_tool_results=keep) as running:
        events = await run_turn(running.stack, "trim", "read five big things")
        last = running.llm.requests[-1]
        messages = await stored(running.stack, "trim")
    assert finished(events).final_text == "Done reading."
    sent = [m["content"] for m in last.messages if m["role"] == "tool"]
    assert len(sent) == 5
    if keep == 0:
        assert all(len(s) > 3000 for s in sent)
        return
    assert sent[:3] == [f"[shell output from an earlier step ({len(f'chunk{i}-') + 3000:,} characters) left out to "
                        f"save room; call again if needed]" for i in range(3)]
    assert sent[3].startswith("chunk3-") and sent[4].startswith("chunk4-")
    # The transcript keeps every output in full.
    assert [len(m.content) for m in messages if m.role == "tool"] == [3007] * 5



def test_a_read_inbox_result_is_never_trimmed_for_its_mail_cannot_be_read_again():
    # A lead's inbox hands each message out once: a placeholder saying "call again" would lose
    # it for good (seen: a lead that waited for a teammate's result its inbox had long delivered).
    mail = "[mail 3 from alice] [plan request plan-1] v2: a regex\n[mail 4 from bob] RESULT-BOB: " + "x" * 200

    def tool(name: str, content: str, n: int) -> ChatMessage:
        return ChatMessage(role="tool", content=content, tool_call_id=f"c{n}", name=name)

    messages = [ChatMessage(role="user", content="go"), tool("read_inbox", mail, 0),
                *(tool("shell", f"chunk{n}-" + "0" * 3000, n) for n in range(1, 4))]
    sent = trim_old_tool_results(messages, keep=2)
    assert sent[1].content == mail
    # The others are trimmed as before, and the inbox's result took none of their places.
    assert sent[2].content.startswith("[shell output from an earlier step")
    assert [m.content[:7] for m in sent[3:]] == ["chunk2-", "chunk3-"]

# --- the repeat detector ----------------------------------------------------------------------


def same_call(request):
    return reply("Trying again.", tool_call("shell", {"command": "cat missing.txt"}))


def alternating(request):
    n = sum(1 for m in request.messages if m["role"] == "tool")
    return reply("", tool_call("shell", {"command": "ls"} if n % 2 else {"command": "pwd"}))


def repeat_notes(request) -> list[str]:
    return [m["content"] for m in request.messages if m["role"] == "system" and "repeating yourself" in m["content"]]


async def test_the_same_call_again_and_again_is_told_then_stopped(tmp_path):
    async with Running(tmp_path, same_call) as running:
        events = await run_turn(running.stack, "loop", "read it", max_iterations=10)
        requests = running.llm.requests
        messages = await stored(running.stack, "loop")
    done = finished(events)
    assert done.stop_reason == "loop" and done.iterations == 4 and done.final_text == "Trying again."
    # Warned once, in the call after the third identical call; stopped at the fourth.
    assert [len(repeat_notes(r)) for r in requests] == [0, 0, 0, 1]
    assert 'the same call (shell {"command": "cat missing.txt"}) 3 times in a row' in repeat_notes(requests[3])[0]
    results = [r.result for r in of_kind(events, "tool_result")]
    assert [r.error_kind for r in results][-1] == "loop" and "kept repeating itself" in results[-1].output
    # The transcript stays replayable: the last call has its "not run" result.
    assert [m.role for m in messages][-2:] == ["assistant", "tool"]


async def test_an_a_b_a_b_cycle_is_a_loop_too(tmp_path):
    async with Running(tmp_path, alternating) as running:
        events = await run_turn(running.stack, "cycle", "look around", max_iterations=10)
    assert finished(events).stop_reason == "loop" and finished(events).iterations == 5
    assert any("two calls in turn" in s for s in statuses(events))


async def test_without_the_repeat_detector_the_loop_runs_to_the_step_budget(tmp_path):
    async with Running(tmp_path, same_call, repeat_limit=0) as running:
        events = await run_turn(running.stack, "noguard", "read it", max_iterations=6)
    assert finished(events).stop_reason == "max_iterations"


# --- token budgets ----------------------------------------------------------------------------


def this_turn(request) -> list[dict]:
    users = [i for i, m in enumerate(request.messages) if m["role"] == "user"]
    return request.messages[users[-1]:]


def costly(request):
    """Every call costs 110 tokens; a tool call with new arguments each step of this turn."""
    n = sum(1 for m in this_turn(request) if m["role"] == "tool")
    if n >= 6:
        return reply("All done.", usage=(100, 10))
    return reply(f"Step {n}.", tool_call("shell", {"command": f"echo {n}"}), usage=(100, 10))


def budget_notes(request) -> list[str]:
    return [m["content"] for m in request.messages if m["role"] == "system" and m["content"].startswith("Budget:")]


async def test_a_turn_budget_warns_then_stops_cleanly(tmp_path):
    async with Running(tmp_path, costly) as running:
        events = await run_turn(running.stack, "budget", "work", token_budget=270)
        requests = running.llm.requests
        messages = await stored(running.stack, "budget")
    done = finished(events)
    # 110, 220 (past 80% of 270: warned), 330 (used up: stopped, its call not run).
    assert done.stop_reason == "budget" and done.iterations == 3 and done.usage.total_tokens == 330
    assert done.final_text == "Step 2."
    assert "220 of the 270-token turn budget used (81%); asking the model to wrap up" in statuses(events)
    assert [len(budget_notes(r)) for r in requests] == [0, 0, 1]
    assert "the turn token budget is used up (330 of 270); stopping" in statuses(events)
    assert [r.result.error_kind for r in of_kind(events, "tool_result")] == ["", "", "budget"]
    assert [m.role for m in messages][-2:] == ["assistant", "tool"]


async def test_without_a_budget_the_same_turn_runs_to_its_end(tmp_path):
    async with Running(tmp_path, costly) as running:
        events = await run_turn(running.stack, "nobudget", "work")
    assert finished(events).stop_reason == "completed" and finished(events).usage.total_tokens == 770


async def test_a_session_budget_counts_earlier_turns_durably(tmp_path):
    async with Running(tmp_path, costly, session_token_budget=1000) as running:
        first = await run_turn(running.stack, "sess", "work")
        assert finished(first).stop_reason == "completed" and finished(first).usage.total_tokens == 770
        await running.stack.restart()  # the count lives in the transcript, not in a process
        second = await run_turn(running.stack, "sess", "more work")
        messages = await stored(running.stack, "sess")
    # 770 earlier + 110 + 110 = 990 < 1000, + 110 = 1100: stopped at the third call of the second turn.
    assert finished(second).stop_reason == "budget" and finished(second).usage.total_tokens == 330
    usage_entries = [json.loads(m.content) for m in messages if m.kind == "usage"]
    assert usage_entries == [{"input_tokens": 700, "output_tokens": 70}, {"input_tokens": 300, "output_tokens": 30}]
    # The model never sees the usage entries.
    assert all('"input_tokens"' not in m["content"] for r in running.llm.requests for m in r.messages)


def delegating(request):
    """The parent delegates once; the child spends 500 tokens; the parent would go on."""
    if "You are a sub-agent" in request.messages[0]["content"]:
        return reply("child answer", usage=(450, 50))
    if not [m for m in request.messages if m["role"] == "tool"]:
        return reply("", tool_call("delegate_task", {"task": "do a part"}), usage=(100, 10))
    return reply("", tool_call("shell", {"command": "echo more"}), usage=(100, 10))


async def test_sub_agents_count_in_the_parents_budget(tmp_path):
    async with Running(tmp_path, delegating, subagent_modes="default,deep") as running:
        events = await run_turn(running.stack, "tree", "delegate", token_budget=600)
    done = finished(events)
    # 110 (parent) + 500 (child) = 610 ≥ 600 after the parent's next reply: stopped there.
    assert done.stop_reason == "budget" and done.usage.total_tokens == 720


async def test_negative_budgets_are_refused(tmp_path):
    import grpc

    async with Running(tmp_path, costly) as running:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await run_turn(running.stack, "neg", "work", token_budget=-1)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "options.token_budget must be 0" in info.value.details()
