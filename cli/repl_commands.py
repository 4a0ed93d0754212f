"""The `agentmesh chat` REPL's slash commands: a line that starts with "/" is one of these, and
never reaches the model ("//text" sends "/text"). Each prints what it did on stderr, so the
reply stream on stdout stays clean.

    /help                   the commands
    /mode auto|normal|manual|default   which calls the session holds for approval
    /model NAME             the session's model (`agentmesh models`)
    /tasks                  the session's task board
    /status                 session, namespace, model, mode, messages, tool policy, a running turn
    /new                    a fresh session (new transcript, new workspace, same options)
    /clear                  a fresh transcript in the same session and workspace
    /compact [FOCUS]        summarise the conversation so far (keeping FOCUS in detail)
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TextIO

import grpc

from agentmesh.cli.common import CliError, call_metadata, rpc_failure
from agentmesh.cli.tasks import fetch_board, render
from agentmesh.config import Settings
from agentmesh.ids import new_id
from agentmesh.toolpolicy import PERMISSION_MODES
from agentmesh.v1 import gateway_pb2, gateway_pb2_grpc, sessions_pb2

__all__ = ["HELP", "ReplCommands", "ReplState"]

HELP = """commands (anything else is sent to the agent; start a message with // to send a leading /):
  /help                          this list
  /mode auto|normal|manual       which tool calls wait for your approval: none, those that change
                                 things (not read-only tools), or every call; /mode default: the deployment's
  /model NAME                    switch this session's model (see `agentmesh models`)
  /tasks                         this session's task board
  /status                        session, namespace, model, mode, messages, tool policy, running turn
  /new                           start a fresh session (new transcript and workspace)
  /clear                         a fresh transcript in this session (workspace and long-term memory stay)
  /compact [FOCUS]               summarise the conversation so far, keeping FOCUS in detail; frees the context"""


@dataclass
class ReplState:
    """What the REPL's turns are sent with; commands change it."""

    session_id: str
    options: gateway_pb2.ChatOptions
    busy: bool = False  # a turn of this REPL is running


class ReplCommands:
    def __init__(self, stub: gateway_pb2_grpc.GatewayStub, settings: Settings, state: ReplState,
                 out: TextIO | None = None):
        self._stub = stub
        self._settings = settings
        self.state = state
        self._out = out

    def _say(self, text: str) -> None:
        out = self._out or sys.stderr
        out.write(text + "\n")
        out.flush()

    @staticmethod
    def message_of(line: str) -> str | None:
        """The text to send for `line`: None when it is a command; "//x" sends "/x"."""
        if line.startswith("//"):
            return line[1:]
        return None if line.startswith("/") else line

    async def run(self, line: str) -> None:
        """Carry out the command `line`; errors are said, never raised (the REPL goes on)."""
        name, _, rest = line.strip().partition(" ")
        handler = {
            "/help": self._help, "/mode": self._mode, "/model": self._model, "/tasks": self._tasks,
            "/status": self._status, "/new": self._new, "/clear": self._clear, "/compact": self._compact,
        }.get(name.lower())
        if handler is None:
            self._say(f"· unknown command {name[:40]}; /help lists the commands (nothing was sent to the agent)")
            return
        try:
            await handler(rest.strip())
        except CliError as exc:
            self._say(f"· {name}: {exc}")

    async def _call(self, method: str, request):
        try:
            return await getattr(self._stub, method)(request, metadata=call_metadata(self._settings), timeout=30)
        except grpc.aio.AioRpcError as err:
            raise rpc_failure(err, "gateway", self._settings) from None

    async def _help(self, _: str) -> None:
        self._say(HELP)

    async def _mode(self, arg: str) -> None:
        if arg not in (*PERMISSION_MODES, "default"):
            self._say("· /mode takes auto, normal or manual (or default: the deployment's)")
            return
        mode = "" if arg == "default" else arg
        session = await self._call("UpdateSession", sessions_pb2.UpdateSessionRequest(
            session_id=self.state.session_id, permission_mode=mode,
            update_mask=["permission_mode"]))
        self.state.options.permission_mode = ""  # the session's mode from now on
        self._say(f"· permission mode: {session.permission_mode or 'default (the deployment’s)'}")

    async def _model(self, arg: str) -> None:
        if not arg:
            self._say("· /model takes a model name; `agentmesh models` lists them")
            return
        session = await self._call("UpdateSession", sessions_pb2.UpdateSessionRequest(
            session_id=self.state.session_id, model=arg, update_mask=["model"]))
        self.state.options.model = ""  # the session's model from now on
        self._say(f"· model: {session.model or 'default'}")

    async def _tasks(self, _: str) -> None:
        tasks = await fetch_board(self._stub, self._settings, self.state.session_id)
        self._say("\n".join(render(tasks)) if tasks else "· no tasks on this session's board")

    async def _status(self, _: str) -> None:
        try:
            session = await self._call("GetSession", sessions_pb2.GetSessionRequest(session_id=self.state.session_id))
        except CliError:
            self._say(f"· session {self.state.session_id}: new (nothing sent yet)")
            return
        running = await self._call("ListApprovals", gateway_pb2.ListApprovalsRequest(session_id=self.state.session_id))
        options = self.state.options
        model = options.model or session.model or "default"
        mode = options.permission_mode or session.permission_mode or "default (the deployment’s)"
        allow = ", ".join(session.tools.allow) if session.tools.allow else "every tool the namespace allows"
        deny = f"; denies {', '.join(session.tools.deny)}" if session.tools.deny else ""
        turn = f"running ({running.run_id}, {len(running.approvals)} waiting for approval)" if running.run_id else "idle"
        self._say("\n".join([
            f"· session {session.session_id} · namespace {session.namespace}",
            f"· model {model} · permission mode {mode}",
            f"· {session.message_count} messages · turn {turn}",
            f"· tools: allows {allow}{deny}",
        ]))

    async def _new(self, _: str) -> None:
        if self.state.busy:
            self._say("· a turn is running; wait for it or press Ctrl-C first")
            return
        self.state.session_id = new_id("s")
        self._say(f"· new session {self.state.session_id}")

    async def _clear(self, _: str) -> None:
        reply = await self._call("ClearTranscript", sessions_pb2.ClearTranscriptRequest(session_id=self.state.session_id))
        self._say(f"· cleared {reply.cleared} messages; session {self.state.session_id} starts afresh "
                  "(its workspace and long-term memory stay)")

    async def _compact(self, focus: str) -> None:
        """A turn that only compacts (ChatOptions.compact): its status lines and outcome are said."""
        if self.state.busy:
            self._say("· a turn is running; wait for it or press Ctrl-C first")
            return
        options = gateway_pb2.ChatOptions()
        options.CopyFrom(self.state.options)
        options.compact, options.compact_focus = True, focus[:500]
        request = gateway_pb2.ChatRequest(session_id=self.state.session_id, options=options,
                                          message="/compact" + (f" {focus}" if focus else ""))
        try:
            async for event in self._stub.Chat(request, metadata=call_metadata(self._settings)):
                kind = event.WhichOneof("payload")
                if kind == "status":
                    self._say(f"· {event.status.message}")
                elif kind == "run_finished":
                    self._say(f"· {event.run_finished.final_text or event.run_finished.stop_reason}")
                elif kind == "error":
                    self._say(f"· /compact: {event.error.message}")
        except grpc.aio.AioRpcError as err:
            raise rpc_failure(err, "gateway", self._settings) from None
