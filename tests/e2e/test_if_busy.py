"""A second message to a busy session (ChatOptions.if_busy): reject, enqueue, interrupt,
rollback — two clients racing over real gRPC, the model a scripted server that refuses any
request breaking the tool-call protocol (as OpenAI does)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from tests.e2e.conftest import LiveTurn, chat, of_kind, rpc_error, transcript, wait_until
from tests.support.llm_server import ScriptedLLMServer, protocol_errors, reply, tool_call


@pytest.fixture
def llm():
    with ScriptedLLMServer(check_protocol=True) as server:
        yield server


def sent(request) -> list[tuple[str, str]]:
    return [(m["role"], m.get("content") or "") for m in request.body["messages"] if m["role"] != "system"]


async def test_reject_refuses_and_an_unknown_policy_is_invalid(stack, llm):
    gateway = stack.gateway_stub()
    llm.add(reply("slow answer", delay_s=1.0))
    first = LiveTurn(gateway, "rej", "first")
    await asyncio.to_thread(llm.wait_for_requests, 1, 10)

    err = await rpc_error(chat(gateway, "rej", "second", if_busy="reject"))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "if_busy" in err.details()
    err = await rpc_error(chat(gateway, "rej", "second", if_busy="later"))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "reject, enqueue, interrupt, rollback" in err.details()

    events = await first.finished()
    assert of_kind(events, "run_finished")[0].stop_reason == "completed"
    assert [m.content for m in await transcript(gateway, "rej") if m.role == "user"] == ["first"]
    assert len(llm.requests) == 1


async def test_enqueue_waits_for_the_running_turn_then_runs_with_its_context(stack, llm):
    gateway, other_client = stack.gateway_stub(), stack.gateway_stub()
    llm.add(reply("first answer", delay_s=1.0), reply("second answer"))
    first = LiveTurn(gateway, "q", "first")
    await asyncio.to_thread(llm.wait_for_requests, 1, 10)

    second = LiveTurn(other_client, "q", "second", if_busy="enqueue")
    first_events, second_events = await first.finished(), await second.finished()

    assert of_kind(first_events, "run_finished")[0].final_text == "first answer"
    assert of_kind(second_events, "run_finished")[0].final_text == "second answer"
    # The second turn began only after the first one's last event.
    assert second_events[0].timestamp >= first_events[-1].timestamp
    assert sent(llm.requests[1]) == [("user", "first"), ("assistant", "first answer"), ("user", "second")]


async def test_interrupt_mid_tool_call_keeps_finished_steps_and_a_valid_transcript(stack, llm):
    gateway, other_client = stack.gateway_stub(), stack.gateway_stub()
    llm.add(
        reply("Listing first.", tool_call("list_dir", {"path": "."})),
        reply("Now the long part.", tool_call("shell", {"command": "sleep 30; touch late.txt"})),
        reply("Redirected: done."),
    )
    first = LiveTurn(gateway, "intr", "do the long job")
    await wait_until(lambda: len(first.of_kind("tool_call")) == 2)

    events = await chat(other_client, "intr", "stop that, just say hi", if_busy="interrupt")
    first_events = await first.finished()

    finished = of_kind(first_events, "run_finished")
    assert [f.stop_reason for f in finished] == ["interrupted"]
    assert of_kind(events, "run_finished")[0].final_text == "Redirected: done."
    # The next request passed the protocol check and carried the whole conversation: the
    # finished step, the interrupted call with a recorded result, then the new message.
    assert protocol_errors(llm.requests[-1].body["messages"]) == []
    roles = [role for role, _ in sent(llm.requests[-1])]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "user"]
    interrupted_result = llm.requests[-1].body["messages"][-2]
    assert "cancelled" in interrupted_result["content"]
    stored = await transcript(gateway, "intr")
    assert [m.role for m in stored] == [*roles, "assistant"]
    assert not (stack.settings.home / "workspaces" / "intr" / "late.txt").exists()


async def test_interrupt_mid_stream_drops_the_partial_reply(stack, llm):
    gateway, other_client = stack.gateway_stub(), stack.gateway_stub()
    llm.add(reply("A long answer that stalls halfway through", chunk_chars=4, pause_after_chunks=3, pause_s=20),
            reply("Short answer."))
    first = LiveTurn(gateway, "mid", "tell me everything")
    await wait_until(lambda: len(first.of_kind("text_delta")) >= 2)

    events = await chat(other_client, "mid", "actually, be brief", if_busy="interrupt")
    first_events = await first.finished()

    assert of_kind(first_events, "run_finished")[0].stop_reason == "interrupted"
    assert of_kind(events, "run_finished")[0].final_text == "Short answer."
    assert sent(llm.requests[-1]) == [("user", "tell me everything"), ("user", "actually, be brief")]
    assert [m.role for m in await transcript(gateway, "mid")] == ["user", "user", "assistant"]


async def test_rollback_removes_the_running_turn_from_the_transcript(stack, llm):
    gateway, other_client = stack.gateway_stub(), stack.gateway_stub()
    llm.add(reply("Earlier answer."))
    await chat(gateway, "rb", "earlier turn")
    llm.add(reply("On it.", tool_call("shell", {"command": "sleep 30"})), reply("Fresh start."))
    first = LiveTurn(gateway, "rb", "a turn to regret")
    await wait_until(lambda: len(first.of_kind("tool_call")) == 1)

    events = await chat(other_client, "rb", "instead, this", if_busy="rollback")
    first_events = await first.finished()

    assert of_kind(first_events, "run_finished")[0].stop_reason == "rolled_back"
    assert of_kind(events, "run_finished")[0].final_text == "Fresh start."
    expected = [("user", "earlier turn"), ("assistant", "Earlier answer."), ("user", "instead, this")]
    assert sent(llm.requests[-1]) == expected
    stored = [(m.role, m.content) for m in await transcript(gateway, "rb")]
    assert stored == [*expected, ("assistant", "Fresh start.")]
    assert [m.seq for m in await transcript(gateway, "rb")] == [1, 2, 3, 4]


async def test_the_deployment_default_applies_when_the_request_names_none(tmp_path, llm):
    from tests.support.stack import Stack

    async with Stack(tmp_path / "home", llm_base_url=llm.base_url,
                     env={"AGENTMESH_GATEWAY_IF_BUSY": "enqueue"}) as stack:
        gateway = stack.gateway_stub()
        llm.add(reply("one", delay_s=0.8), reply("two"))
        first = LiveTurn(gateway, "dflt", "first")
        await asyncio.to_thread(llm.wait_for_requests, 1, 10)
        events = await chat(stack.gateway_stub(), "dflt", "second")
        assert of_kind(events, "run_finished")[0].final_text == "two"
        assert of_kind(await first.finished(), "run_finished")[0].final_text == "one"


async def test_cli_if_busy_interrupt_and_a_bad_policy_is_a_usage_error(stack, llm):
    from tests.e2e.test_auth_and_cli import run_cli

    gateway = stack.gateway_stub()
    llm.add(reply("Working.", tool_call("shell", {"command": "sleep 30"})), reply("Interrupted you."))
    first = LiveTurn(gateway, "cli-busy", "long job")
    await wait_until(lambda: len(first.of_kind("tool_call")) == 1)

    code, out, err = await run_cli(stack, "chat", "new direction", "--session", "cli-busy", "--if-busy", "interrupt")
    assert code == 0, err
    assert "Interrupted you." in out
    assert of_kind(await first.finished(), "run_finished")[0].stop_reason == "interrupted"

    code, _, err = await run_cli(stack, "chat", "x", "--session", "cli-busy", "--if-busy", "sometimes")
    assert code == 2 and "--if-busy" in err


async def prompt(proc) -> None:
    """Wait for the REPL's next `you> ` prompt (on stderr, without a newline)."""
    await asyncio.wait_for(proc.stderr.readuntil(b"you> "), 30)


async def test_typing_in_the_repl_while_the_agent_works_interrupts_it(stack, llm):
    import os
    import pty
    import sys

    from agentmesh.cli.chat import READY_TO_INTERRUPT
    from tests.e2e.test_approvals import cli_env, read_until

    llm.add(reply("Working.", tool_call("shell", {"command": "sleep 30"})), reply("Redirected at once."))
    controller, terminal = pty.openpty()  # the REPL's stdin is a terminal, as for a person
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentmesh.cli.main", "chat", "--session", "repl", env=cli_env(stack),
        stdin=terminal, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    os.close(terminal)
    try:
        # Each line is typed when the REPL shows it is ready for it, never on a timer: a message at
        # its prompt, an interruption once it says the turn runs at the gateway (and the tool call
        # is under way), the empty line that leaves at the prompt after the second turn (an empty
        # line typed while a turn still runs is ignored, as a stray Enter should be).
        await prompt(proc)
        os.write(controller, b"a long job\n")
        await read_until(proc.stderr, lambda line: READY_TO_INTERRUPT in line)
        await read_until(proc.stdout, lambda line: line.startswith("→ shell"))
        os.write(controller, b"never mind, something else\n")
        lines = await read_until(proc.stdout, lambda line: "Redirected at once." in line)
        await prompt(proc)
        os.write(controller, b"\n")  # an empty line leaves
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        os.close(controller)
        if proc.returncode is None:
            proc.kill()
    assert any("done (interrupted)" in line for line in lines), lines
    users = [m.content for m in await transcript(stack.gateway_stub(), "repl") if m.role == "user"]
    assert users == ["a long job", "never mind, something else"]
    assert protocol_errors(llm.requests[-1].body["messages"]) == []
