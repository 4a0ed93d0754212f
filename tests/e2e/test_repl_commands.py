"""`agentmesh chat`'s REPL commands in a real terminal (a pty as its stdin, as for a person),
against the whole stack over real gRPC and a scripted OpenAI-protocol model: what each command
changes is checked at the gateway, and no command ever reaches the model."""

from __future__ import annotations

import asyncio
import os
import pty
import sys

import pytest

from agentmesh.v1 import sessions_pb2
from tests.e2e.conftest import transcript
from tests.e2e.test_approvals import cli_env, read_until
from tests.support.llm_server import ScriptedLLMServer, reply, tool_call
from tests.support.stack import Stack


@pytest.fixture
def second():
    with ScriptedLLMServer() as server:
        yield server


@pytest.fixture
async def stack(tmp_path, llm, second):
    catalog = tmp_path / "models.yaml"
    catalog.write_text(f"models:\n  - name: second\n    base_url: {second.base_url}\n    model: second-model\n")
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env={"AGENTMESH_MODELS": str(catalog)}) as running:
        yield running


class Repl:
    """The REPL as a child process: lines typed into its terminal, its stderr read to its prompts."""

    def __init__(self, proc, controller: int):
        self.proc = proc
        self.controller = controller

    async def until_prompt(self) -> str:
        """Everything written to stderr up to the next `you> ` prompt."""
        return (await asyncio.wait_for(self.proc.stderr.readuntil(b"you> "), 30)).decode()

    async def command(self, line: str) -> str:
        """Type `line` at the prompt; what the REPL said before its next prompt."""
        os.write(self.controller, line.encode() + b"\n")
        return await self.until_prompt()


@pytest.fixture
async def repl(stack):
    controller, terminal = pty.openpty()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentmesh.cli.main", "chat", "--session", "cmds", env=cli_env(stack),
        stdin=terminal, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    os.close(terminal)
    session = Repl(proc, controller)
    try:
        await session.until_prompt()
        yield session
    finally:
        os.close(controller)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def session_of(stack, session_id: str):
    return await stack.gateway_stub().GetSession(sessions_pb2.GetSessionRequest(session_id=session_id), timeout=10)


async def test_repl_commands_change_the_session_and_never_reach_the_model(stack, llm, second, repl):
    said = await repl.command("/help")
    for command in ("/mode", "/model", "/tasks", "/status", "/new", "/clear"):
        assert command in said
    said = await repl.command("/frobnicate now")
    assert "unknown command /frobnicate" in said and "/help" in said

    # A first turn creates the session; then the commands act on it.
    llm.add(reply("Hello."))
    await repl.command("hi")
    said = await repl.command("/mode manual")
    assert "permission mode: manual" in said
    assert (await session_of(stack, "cmds")).permission_mode == "manual"
    said = await repl.command("/mode sometimes")
    assert "auto, normal or manual" in said and (await session_of(stack, "cmds")).permission_mode == "manual"
    said = await repl.command("/model nope")
    assert "nope" in said and "second" in said  # the gateway's INVALID_ARGUMENT names the known models
    said = await repl.command("/model second")
    assert "model: second" in said and (await session_of(stack, "cmds")).model == "second"

    # The next turn goes to the second model, and manual mode holds even a read: "a" approves
    # it and the rest of the turn at the prompt.
    second.add(reply("", tool_call("list_dir", {}, id="r1")), reply("", tool_call("list_dir", {}, id="r2")),
               reply("Listed twice."))
    os.write(repl.controller, b"list the files\n")
    asked = await asyncio.wait_for(repl.proc.stderr.readuntil(b"[y/N/a=all this turn] "), 30)
    assert b"approve list_dir" in asked
    os.write(repl.controller, b"a\n")
    out = await read_until(repl.proc.stdout, lambda line: "Listed twice." in line)
    await repl.until_prompt()
    assert sum("← list_dir" in line for line in out) == 2
    assert len(second.requests) == 3 and len(llm.requests) == 1

    said = await repl.command("/status")
    assert "session cmds" in said and "model second" in said and "permission mode manual" in said
    assert "messages" in said and "turn idle" in said
    said = await repl.command("/tasks")
    assert "no tasks" in said

    said = await repl.command("/clear")
    assert "cleared" in said and await transcript(stack.gateway_stub(), "cmds") == []
    assert (await session_of(stack, "cmds")).model == "second"  # same session, same settings

    said = await repl.command("/new")
    assert "new session s-" in said
    new_id = said.split("new session ")[1].split()[0]
    llm.add(reply("Fresh."))
    await repl.command("//slash is a message")
    assert [m.content for m in await transcript(stack.gateway_stub(), new_id) if m.role == "user"] == ["/slash is a message"]
    assert (await session_of(stack, new_id)).model == ""  # a new session starts on the default model

    # No command reached a model: its requests are exactly the three turns' own.
    assert len(llm.requests) == 2 and len(second.requests) == 3
    os.write(repl.controller, b"\n")
    assert await asyncio.wait_for(repl.proc.wait(), 30) == 0


async def test_compact_in_the_repl_summarises_the_conversation_and_shows_the_fill(stack, llm, repl):
    llm.add(reply("Parsers are fun."), reply("The lexer comes first."))
    os.write(repl.controller, b"tell me about parsers\n")
    out = await read_until(repl.proc.stdout, lambda line: "· context: " in line)  # the context-fill figure
    assert out[-1].rstrip().endswith("%)") and " tokens (" in out[-1]
    await repl.until_prompt()
    os.write(repl.controller, b"and lexers?\n")
    await read_until(repl.proc.stdout, lambda line: "· context: " in line)
    await repl.until_prompt()
    llm.add(reply("SUMMARY: parsers and lexers were discussed."))
    said = await repl.command("/compact the lexer")
    assert "compacted 4 earlier messages into a summary" in said
    summary_request = llm.requests[-1]
    assert "Focus: keep in detail what concerns 'the lexer'" in summary_request.messages[1]["content"]
    llm.add(reply("Next."))
    await repl.command("go on")
    assert llm.requests[-1].messages[1]["content"].endswith("SUMMARY: parsers and lexers were discussed.")
    assert len(llm.requests) == 4  # two turns, the summary, one turn: /compact asked nothing else
    os.write(repl.controller, b"\n")
    assert await asyncio.wait_for(repl.proc.wait(), 30) == 0
