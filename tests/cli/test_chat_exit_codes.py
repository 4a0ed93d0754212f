"""`agentmesh chat MESSAGE` exits with what became of the turn (docs/architecture.md, "The command
line"): 0 it completed, 1 the server reported an error, 2 a usage error, 3 it stopped at its step
or token limit, 130 interrupted with Ctrl-C. Each through the five real services and the command
run as a user runs it, against the scripted model server."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

import pytest

from tests.support.llm_server import ScriptedLLMServer, failure, reply, tool_call
from tests.support.stack import Stack


def busy_model(request):
    """A model that always wants one more (different) command, and answers in words when it is
    offered no tools (the agent's summary call at the step limit)."""
    if not request.body.get("tools"):
        return reply("here is where I got to", usage=(100, 10))
    return reply("", tool_call("shell", {"command": f"echo step {request.index}"}), usage=(400, 20))


@pytest.fixture
async def llm():
    with ScriptedLLMServer(default=busy_model) as server:
        yield server


@pytest.fixture
async def stack(tmp_path, llm):
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url) as running:
        yield running


def cli_env(stack: Stack) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTMESH_")}
    env.update(stack.env)
    env.update({f"AGENTMESH_{name.upper()}_ADDR": addr for name, addr in stack.addresses.items()})
    return env


def ctrl_c_as_at_a_terminal() -> None:
    """SIGINT at its default in the CLI, as at a terminal: a suite started in the background by a
    shell (`make test &`) runs with SIGINT ignored, which a child would inherit."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


async def start_chat(stack: Stack, *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentmesh.cli.main", "chat", *args, env=cli_env(stack),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        preexec_fn=ctrl_c_as_at_a_terminal,
    )


async def chat(stack: Stack, *args: str) -> tuple[int, str, str]:
    proc = await start_chat(stack, *args)
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    return proc.returncode, out.decode(), err.decode()


def finished(out: str) -> dict:
    events = [json.loads(line) for line in out.splitlines()]
    assert events[-1]["type"] == "run_finished", events[-1]
    return events[-1]


async def test_a_turn_that_completes_exits_0(stack, llm):
    llm.add(reply("hello there"))
    code, out, err = await chat(stack, "hi", "--json")
    assert code == 0, err
    assert finished(out)["stop_reason"] == "completed"


async def test_a_turn_stopped_at_its_step_limit_exits_3(stack):
    code, out, err = await chat(stack, "keep going", "--max-iterations", "2", "--json")
    assert finished(out)["stop_reason"] == "max_iterations"
    assert code == 3, err
    # The same in words: the stop is shown, and the exit code says it.
    code, out, err = await chat(stack, "keep going", "--max-iterations", "1")
    assert code == 3, err
    assert "max_iterations" in out + err


async def test_a_turn_stopped_at_its_token_budget_exits_3(stack):
    code, out, err = await chat(stack, "keep going", "--token-budget", "500", "--json")
    assert finished(out)["stop_reason"] == "budget"
    assert code == 3, err


async def test_ctrl_c_mid_turn_cancels_the_turn_and_exits_130(stack, llm):
    llm.add(reply("", tool_call("shell", {"command": "sleep 30"})))
    proc = await start_chat(stack, "run something slow", "--json")
    await asyncio.to_thread(llm.wait_for_requests, 1, 30)
    await asyncio.sleep(0.5)  # the model answered; the slow command runs in the sandbox
    proc.send_signal(signal.SIGINT)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert finished(out.decode())["stop_reason"] == "cancelled"
    assert proc.returncode == 130, err.decode()


async def test_an_error_the_server_reports_exits_1(stack, llm):
    llm.add(failure(400, message="this model does not exist"))
    code, out, err = await chat(stack, "hi", "--json")
    assert code == 1, err
    assert [json.loads(line)["type"] for line in out.splitlines()][-1] == "error"


@pytest.mark.parametrize("args, says", [
    (("hi", "--max-iterations", "-1"), "--max-iterations"),
    (("hi", "--session", "no spaces/or slashes"), "malformed"),
    (("hi", "--token-budget", "lots"), "not a whole number"),
])
async def test_usage_errors_exit_2_before_anything_runs(stack, llm, args, says):
    code, _, err = await chat(stack, *args)
    assert code == 2, err
    assert says in err and "Traceback" not in err
    assert llm.requests == []


async def start_repl(stack: Stack) -> asyncio.subprocess.Process:
    """`agentmesh chat` without a message, its stdin a pipe: the REPL that reads line by line."""
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentmesh.cli.main", "chat", "--json", env=cli_env(stack),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        preexec_fn=ctrl_c_as_at_a_terminal,
    )


async def repl_prompt(proc: asyncio.subprocess.Process) -> None:
    await asyncio.wait_for(proc.stdout.readuntil(b"you> "), 30)


async def test_ctrl_c_at_the_repl_prompt_leaves_at_once_with_130(stack):
    proc = await start_repl(stack)
    await repl_prompt(proc)
    proc.send_signal(signal.SIGINT)
    # stdin stays open: the REPL must not wait for a line that is never typed.
    assert await asyncio.wait_for(proc.wait(), 30) == 130
    proc.stdin.close()


async def test_the_repl_leaves_with_130_after_ctrl_c_cancelled_its_last_turn(stack, llm):
    llm.add(reply("", tool_call("shell", {"command": "sleep 30"})))
    proc = await start_repl(stack)
    await repl_prompt(proc)
    proc.stdin.write(b"run something slow\n")
    await asyncio.to_thread(llm.wait_for_requests, 1, 30)
    await asyncio.sleep(0.5)
    proc.send_signal(signal.SIGINT)  # cancels the turn; the REPL goes on to its next prompt
    await repl_prompt(proc)
    proc.stdin.write(b"\n")  # an empty line leaves
    await proc.stdin.drain()
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 130, err.decode()
