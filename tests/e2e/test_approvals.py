"""Tool-call approvals end to end: a held call, a person's decision through Gateway.Approve,
over real gRPC across all five services, with a scripted model."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import grpc
import pytest

from agentmesh.v1 import gateway_pb2
from tests.e2e.conftest import chat, kinds, of_kind, rpc_error, transcript, wait_until
from tests.support.llm_server import reply, tool_call
from tests.support.stack import Stack
from tests.support.turns import LiveTurn

APPROVAL_ENV = {"AGENTMESH_AGENT_APPROVAL_TOOLS": "shell"}


@pytest.fixture
async def stack(tmp_path, llm):
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=APPROVAL_ENV) as running:
        yield running


def approve(session_id: str, call_id: str, approved: bool = True, note: str = "") -> gateway_pb2.ApproveRequest:
    return gateway_pb2.ApproveRequest(session_id=session_id, call_id=call_id, approved=approved, note=note)


def workspace(stack: Stack, session_id: str):
    return stack.settings.home / "workspaces" / session_id


async def test_an_approved_call_runs(stack, llm):
    gateway = stack.gateway_stub()
    llm.add(reply("", tool_call("shell", {"command": "echo yes > approved.txt"}, id="c1")), reply("Done."))
    turn = LiveTurn(gateway, "ok", "make the file")

    request = await turn.approval_request()
    assert (request.call_id, request.name) == ("c1", "shell")
    assert json.loads(request.arguments_json) == {"command": "echo yes > approved.txt"}
    assert request.timeout_s == 600
    # Held: the model is not asked again and nothing ran while the call waits.
    await asyncio.sleep(0.3)
    assert len(llm.requests) == 1 and not (workspace(stack, "ok") / "approved.txt").exists()

    answer = await gateway.Approve(approve("ok", "c1"), timeout=10)
    assert answer.accepted and answer.run_id == turn.events[0].run_id
    events = await turn.finished()

    order = kinds(events)
    assert order.index("tool_call") < order.index("approval_request") < order.index("approval_resolved") < order.index("tool_result")
    resolved = of_kind(events, "approval_resolved")[0]
    assert resolved.approved and resolved.decided_by == "user" and resolved.call_id == "c1"
    result = of_kind(events, "tool_result")[0].result
    assert not result.is_error
    assert (workspace(stack, "ok") / "approved.txt").read_text() == "yes\n"
    assert of_kind(events, "run_finished")[0].final_text == "Done."

    # Decided once: a second decision on the same call finds nothing waiting.
    err = await rpc_error(gateway.Approve(approve("ok", "c1"), timeout=10))
    assert err.code() == grpc.StatusCode.NOT_FOUND


async def test_a_denied_call_does_not_run_and_the_model_reads_why(stack, llm):
    gateway = stack.gateway_stub()
    llm.add(reply("", tool_call("shell", {"command": "touch denied.txt"}, id="c1")), reply("Understood, I did not."))
    turn = LiveTurn(gateway, "no", "make the file")
    await turn.approval_request()

    await gateway.Approve(approve("no", "c1", approved=False, note="not on a Friday"), timeout=10)
    events = await turn.finished()

    resolved = of_kind(events, "approval_resolved")[0]
    assert not resolved.approved and resolved.note == "not on a Friday" and resolved.decided_by == "user"
    result = of_kind(events, "tool_result")[0].result
    assert result.is_error and result.error_kind == "denied"
    assert "denied by the user: not on a Friday" in result.output
    assert not (workspace(stack, "no") / "denied.txt").exists()
    tool_messages = [m for m in llm.requests[1].body["messages"] if m["role"] == "tool"]
    assert tool_messages[0]["tool_call_id"] == "c1" and "denied by the user: not on a Friday" in tool_messages[0]["content"]
    stored = await transcript(gateway, "no")
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert "denied by the user" in stored[2].content


async def test_an_undecided_call_is_denied_when_the_wait_times_out(tmp_path, llm):
    env = {**APPROVAL_ENV, "AGENTMESH_AGENT_APPROVAL_TIMEOUT_S": "0.5"}
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=env) as stack:
        gateway = stack.gateway_stub()
        llm.add(reply("", tool_call("shell", {"command": "touch late.txt"}, id="c1")), reply("Nobody answered."))
        events = await chat(gateway, "late", "make the file")

        assert of_kind(events, "approval_request")[0].timeout_s == 0.5
        resolved = of_kind(events, "approval_resolved")[0]
        assert not resolved.approved and resolved.decided_by == "timeout"
        result = of_kind(events, "tool_result")[0].result
        assert result.is_error and result.error_kind == "denied" and "no decision within 0.5 s" in result.output
        assert not (workspace(stack, "late") / "late.txt").exists()
        assert of_kind(events, "run_finished")[0].final_text == "Nobody answered."
        err = await rpc_error(gateway.Approve(approve("late", "c1"), timeout=10))
        assert err.code() == grpc.StatusCode.NOT_FOUND


async def test_decisions_on_nothing_waiting_or_malformed_are_refused(stack, llm):
    gateway = stack.gateway_stub()
    # No turn at all on the session.
    err = await rpc_error(gateway.Approve(approve("idle", "c1"), timeout=10))
    assert err.code() == grpc.StatusCode.NOT_FOUND and "no tool call 'c1' waiting" in err.details()

    llm.add(reply("", tool_call("shell", {"command": "touch x.txt"}, id="c1")), reply("ok"))
    turn = LiveTurn(gateway, "busy", "go")
    await turn.approval_request()
    err = await rpc_error(gateway.Approve(approve("busy", "c-unknown"), timeout=10))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    err = await rpc_error(gateway.Approve(approve("other", "c1"), timeout=10))  # right call, wrong session
    assert err.code() == grpc.StatusCode.NOT_FOUND
    for bad, words in [
        (approve("busy", ""), "call_id is required"),
        (approve("busy", "x" * 257), "call_id is longer"),
        (approve("bad id!", "c1"), "malformed"),
        (approve("busy", "c1", note="n" * 4001), "note is 4001 characters"),
    ]:
        err = await rpc_error(gateway.Approve(bad, timeout=10))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and words in err.details(), bad
    # None of that decided anything: the call still waits, and a real decision still works.
    assert "tool_result" not in kinds(turn.events)
    await gateway.Approve(approve("busy", "c1", approved=False), timeout=10)
    events = await turn.finished()
    assert of_kind(events, "tool_result")[0].result.error_kind == "denied"
    assert "denied by the user" in of_kind(events, "tool_result")[0].result.output

    err = await rpc_error(chat(gateway, "busy", "hi", approval_tools=[""]))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "approval_tools" in err.details()


async def test_cancel_while_waiting_ends_the_turn_and_nothing_runs(stack, llm):
    gateway = stack.gateway_stub()
    llm.add(reply("", tool_call("shell", {"command": "touch never.txt"}, id="c1")))
    turn = LiveTurn(gateway, "stop", "go")
    await turn.approval_request()

    answer = await gateway.Cancel(gateway_pb2.CancelRequest(session_id="stop"), timeout=10)
    assert answer.cancelled
    events = await turn.finished()
    assert kinds(events)[-1] == "run_finished" and events[-1].run_finished.stop_reason == "cancelled"
    assert not (workspace(stack, "stop") / "never.txt").exists()
    err = await rpc_error(gateway.Approve(approve("stop", "c1"), timeout=10))
    assert err.code() == grpc.StatusCode.NOT_FOUND

    # The step is closed in the transcript, and the session takes its next turn.
    async def closed() -> bool:
        return [m.role for m in await transcript(gateway, "stop")] == ["user", "assistant", "tool"]

    deadline = asyncio.get_running_loop().time() + 10
    while not await closed():
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.05)
    llm.add(reply("back"))
    assert of_kind(await chat(gateway, "stop", "again"), "run_finished")[0].final_text == "back"


async def test_other_tools_run_without_asking_while_a_held_call_waits(stack, llm):
    gateway = stack.gateway_stub()
    llm.add(
        reply("", tool_call("shell", {"command": "cat free.txt > copy.txt"}, id="held"),
              tool_call("write_file", {"path": "free.txt", "content": "free"}, id="free")),
        reply("Both done."),
    )
    turn = LiveTurn(gateway, "mixed", "go")
    request = await turn.approval_request()
    assert request.call_id == "held"
    # write_file needs no approval: it finishes while shell still waits.
    await wait_until(lambda: any(r.result.call_id == "free" for r in of_kind(turn.events, "tool_result")))
    assert [r.call_id for r in of_kind(turn.events, "approval_request")] == ["held"]
    listing = await gateway.ListApprovals(gateway_pb2.ListApprovalsRequest(session_id="mixed"), timeout=10)
    assert listing.run_id == turn.events[0].run_id and [p.call_id for p in listing.approvals] == ["held"]

    await gateway.Approve(approve("mixed", "held"), timeout=10)
    events = await turn.finished()
    assert all(not r.result.is_error for r in of_kind(events, "tool_result"))
    listing = await gateway.ListApprovals(gateway_pb2.ListApprovalsRequest(session_id="mixed"), timeout=10)
    assert not listing.run_id and list(listing.approvals) == []
    assert (workspace(stack, "mixed") / "copy.txt").read_text() == "free"


async def test_a_turn_can_ask_for_approval_of_more_tools(stack, llm):
    gateway = stack.gateway_stub()
    llm.add(reply("", tool_call("write_file", {"path": "a.txt", "content": "a"}, id="w")), reply("ok"))
    turn = LiveTurn(gateway, "extra", "go", approval_tools=["write_file"])
    assert (await turn.approval_request()).name == "write_file"
    await gateway.Approve(approve("extra", "w", approved=False, note="no"), timeout=10)
    events = await turn.finished()
    assert of_kind(events, "tool_result")[0].result.error_kind == "denied"
    assert not (workspace(stack, "extra") / "a.txt").exists()


async def test_without_configuration_nothing_is_held(tmp_path, llm):
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url) as stack:
        llm.add(reply("", tool_call("shell", {"command": "echo free"}, id="c1")), reply("ok"))
        events = await chat(stack.gateway_stub(), "plain", "go")
        assert "approval_request" not in kinds(events)
        assert not of_kind(events, "tool_result")[0].result.is_error


# --- the CLI: one process streams the turn, another decides ---------------------------------


def cli_env(stack: Stack) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTMESH_")}
    env.update(stack.env)
    env.update({f"AGENTMESH_{name.upper()}_ADDR": addr for name, addr in stack.addresses.items()})
    return env


async def start_cli(stack: Stack, *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentmesh.cli.main", *args, env=cli_env(stack),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )


async def run_cli(stack: Stack, *args: str) -> tuple[int, str, str]:
    proc = await start_cli(stack, *args)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode(), err.decode()


async def read_until(stream: asyncio.StreamReader, predicate) -> list[str]:
    lines = []
    while True:
        line = (await asyncio.wait_for(stream.readline(), 30)).decode()
        assert line, f"output ended before the expected line: {lines}"
        lines.append(line)
        if predicate(line):
            return lines


async def test_cli_json_chat_and_approvals_command_from_another_process(stack, llm):
    llm.add(reply("", tool_call("shell", {"command": "echo via-cli > cli.txt"}, id="c1")), reply("Done."))
    chat_proc = await start_cli(stack, "chat", "go", "--session", "cli", "--json")
    lines = await read_until(chat_proc.stdout, lambda line: '"approval_request"' in line)
    request = json.loads(lines[-1])
    assert request["type"] == "approval_request" and request["call_id"] == "c1" and request["name"] == "shell"
    assert request["arguments"] == {"command": "echo via-cli > cli.txt"}

    code, out, err = await run_cli(stack, "approvals", "list", "--session", "cli", "--json")
    assert code == 0, err
    pending = json.loads(out)
    assert [(p["call_id"], p["name"]) for p in pending] == [("c1", "shell")]
    assert json.loads(pending[0]["arguments_json"]) == {"command": "echo via-cli > cli.txt"}

    code, out, err = await run_cli(stack, "approvals", "approve", "c1", "--session", "cli")
    assert code == 0, err
    assert "approved" in out
    rest, chat_err = await asyncio.wait_for(chat_proc.communicate(), 30)
    assert chat_proc.returncode == 0, chat_err.decode()
    events = [json.loads(line) for line in [*lines, *rest.decode().splitlines()]]
    assert [e["type"] for e in events if e["type"].startswith("approval")] == ["approval_request", "approval_resolved"]
    assert (workspace(stack, "cli") / "cli.txt").read_text() == "via-cli\n"

    code, _, err = await run_cli(stack, "approvals", "deny", "c1", "--session", "cli", "--note", "late")
    assert code == 1 and "NOT_FOUND" in err
    code, out, _ = await run_cli(stack, "approvals", "list", "--session", "cli")
    assert code == 0 and "nothing waits" in out


async def test_cli_human_chat_without_a_terminal_says_how_to_decide(stack, llm):
    llm.add(reply("", tool_call("shell", {"command": "touch nope.txt"}, id="c1")), reply("Fine."))
    chat_proc = await start_cli(stack, "chat", "go", "--session", "cli-h")
    lines = await read_until(chat_proc.stdout, lambda line: "agentmesh approvals" in line)
    text = "".join(lines)
    assert "shell" in text and "touch nope.txt" in text
    assert "agentmesh approvals approve c1 --session cli-h" in text

    code, _, err = await run_cli(stack, "approvals", "deny", "c1", "--session", "cli-h", "--note", "no thanks")
    assert code == 0, err
    rest, _ = await asyncio.wait_for(chat_proc.communicate(), 30)
    assert chat_proc.returncode == 0
    assert "denied by the user: no thanks" in rest.decode()
    assert not (workspace(stack, "cli-h") / "nope.txt").exists()


async def test_cli_repl_asks_at_the_prompt_and_sends_the_answer(stack, llm):
    llm.add(
        reply("", tool_call("shell", {"command": "touch one.txt"}, id="c1")), reply("made one"),
        reply("", tool_call("shell", {"command": "touch two.txt"}, id="c2")), reply("skipped two"),
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentmesh.cli.main", "chat", "--session", "repl", env=cli_env(stack),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    # The REPL reads one line per question, in order: a turn, its approval, the next turn, ...
    out, err = await asyncio.wait_for(proc.communicate(b"first\ny\nsecond\nn too risky\n\n"), 60)
    out = out.decode()
    assert proc.returncode == 0, err.decode()
    assert out.count("approve shell") == 2
    assert (workspace(stack, "repl") / "one.txt").exists()
    assert not (workspace(stack, "repl") / "two.txt").exists()
    assert "denied: too risky" in out and "denied by the user: too risky" in out


def test_cli_terminal_answers():
    from agentmesh.cli.chat import parse_answer

    assert parse_answer("y") == (True, "", False) and parse_answer(" YES \n") == (True, "", False)
    assert parse_answer("") == (False, "", False) and parse_answer("no") == (False, "", False)
    assert parse_answer("n too risky") == (False, "too risky", False)
    assert parse_answer("not on prod please") == (False, "not on prod please", False)
    assert parse_answer("a") == (True, "", True) and parse_answer("all") == (True, "", True)
