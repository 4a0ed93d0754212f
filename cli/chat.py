"""`agentmesh chat`: stream one turn (or a REPL of turns) and show its events."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import threading
from typing import Callable, TextIO

import grpc

from agentmesh.cli.approvals import send_decision
from agentmesh.cli.common import (
    EXIT_OK,
    EXIT_SERVER_ERROR,
    EXIT_USAGE,
    CliError,
    call_metadata,
    channel_to,
    load_settings,
    print_json,
    rpc_failure,
)
from agentmesh.cli.render import HumanRenderer, event_to_json, shorten
from agentmesh.cli.repl_commands import ReplCommands, ReplState
from agentmesh.config import Settings
from agentmesh.ids import new_id
from agentmesh.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc


def register(subparsers) -> None:
    chat = subparsers.add_parser("chat", help="stream one turn of a session (a REPL without MESSAGE)")
    chat.add_argument("message", nargs="?", help="the user's message; omit it for an interactive session")
    chat.add_argument("--session", help="session id (created when new; default: a fresh session)")
    chat.add_argument("--json", action="store_true", help="print one JSON event per line")
    chat.add_argument("--max-iterations", type=int, default=0, help="cap on model calls in this turn")
    chat.add_argument("--model", default="", help="override the configured model for this turn")
    chat.add_argument("--agent", default="", metavar="NAME[@VERSION]",
                      help="run a named agent of the session's namespace (agentmesh agents list)")
    chat.add_argument("--mode", choices=("default", "deep"), default="",
                      help="run mode: deep plans first, reflects on the plan, has a larger step budget and sub-agents")
    chat.add_argument("--require-approval", action="append", default=[], metavar="TOOL",
                      help="also hold calls to TOOL for approval in this turn ('*': every tool); repeatable")
    chat.add_argument("--plan", action="store_true",
                      help="plan mode: the agent writes a plan and waits for your approval before anything runs")
    chat.add_argument("--token-budget", type=_budget, default=0, metavar="TOKENS",
                      help="stop this turn cleanly (stop_reason budget) once it has used this many tokens")
    chat.add_argument("--session-token-budget", type=_budget, default=0, metavar="TOKENS",
                      help="stop once the session as a whole has used this many tokens")
    chat.add_argument("--attach", metavar="SESSION", default="",
                      help="follow the session's running turn from its start to its end (after a dropped "
                           "connection, or a turn another client started); Ctrl-C cancels it")
    chat.add_argument("--permission-mode", choices=("auto", "normal", "manual"), default="",
                      help="which tool calls this turn holds for approval: none (auto), every tool not marked "
                           "read-only (normal), every call (manual); default: the session's (/mode in the REPL)")
    chat.add_argument("--allow-tool", action="append", default=[], metavar="TOOL",
                      help="offer only these tools in this turn (within what the session allows); repeatable")
    chat.add_argument("--deny-tool", action="append", default=[], metavar="TOOL",
                      help="do not offer this tool in this turn; repeatable")
    chat.add_argument("--if-busy", choices=("reject", "enqueue", "interrupt", "rollback"), default="",
                      help="if the session is already running a turn: refuse (reject), wait for it (enqueue), "
                           "stop it and go on from its finished steps (interrupt), or stop it and remove its "
                           "steps (rollback); default: the gateway's AGENTMESH_GATEWAY_IF_BUSY")
    chat.set_defaults(func=run_chat)


def _budget(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of tokens") from None
    if value < 0:
        raise argparse.ArgumentTypeError("a token budget is a positive number of tokens (0: the configured one)")
    return value


def parse_answer(answer: str) -> tuple[bool, str, bool]:
    """"y"/"yes" approves; "a"/"all" approves this call and the rest of the turn; "n REASON"/"no
    REASON" denies with REASON; any other text denies with that text as the note (so "not on prod
    please" says why). (approved, note, rest_of_turn)."""
    text = answer.strip()
    if text.lower() in ("y", "yes"):
        return True, "", False
    if text.lower() in ("a", "all"):
        return True, "", True
    first, _, rest = text.partition(" ")
    return False, rest.strip() if first.lower() in ("n", "no") else text, False


class ApprovalPrompter:
    """Asks at the terminal whether a held tool call may run, one question at a time, and sends
    the answer with Gateway.Approve (see `parse_answer`)."""

    def __init__(self, stub: gateway_pb2_grpc.GatewayStub, settings: Settings, *, routed: bool = False):
        self._stub = stub
        self._settings = settings
        self._lock = asyncio.Lock()
        self._asking = ""  # the call_id of the open question
        # routed: the REPL reads the terminal and hands over the answer (take_line); else input().
        self._routed = routed
        self._answer: asyncio.Future | None = None

    async def _read(self, prompt: str) -> str:
        if not self._routed:
            return await asyncio.to_thread(input, prompt)
        sys.stderr.write(prompt)
        sys.stderr.flush()
        self._answer = asyncio.get_running_loop().create_future()
        try:
            return await self._answer
        finally:
            self._answer = None

    def take_line(self, line: str) -> bool:
        """A line typed while a question is open answers it; False when none is open."""
        if self._answer is None or self._answer.done():
            return False
        self._answer.set_result(line)
        return True

    async def ask(self, event: common_pb2.Event) -> None:
        a = event.approval_request
        async with self._lock:
            self._asking = a.call_id
            try:
                answer = await self._read(f"approve {a.name} {shorten(a.arguments_json)}? [y/N/a=all this turn] ")
            except EOFError:
                answer = ""
            finally:
                self._asking = ""
        approved, note, rest_of_turn = parse_answer(answer)
        try:
            await send_decision(self._stub, self._settings, event.session_id, a.call_id, approved, note, rest_of_turn)
        except CliError as exc:  # decided elsewhere, timed out, or the turn ended meanwhile
            sys.stderr.write(f"· {a.name} was not decided here: {exc}\n")

    def notice(self, event: common_pb2.Event) -> None:
        """A call decided while its question is open (timeout, another client, cancel)."""
        kind = event.WhichOneof("payload")
        resolved = kind == "approval_resolved" and event.approval_resolved.call_id == self._asking
        if self._asking and (resolved or kind in ("run_finished", "error")):
            sys.stderr.write("\n· that question is moot now; press Enter to go on\n")


async def stream_turn(
    stub: gateway_pb2_grpc.GatewayStub,
    settings: Settings,
    request: gateway_pb2.ChatRequest,
    on_event,
    on_approval: "ApprovalPrompter | None" = None,
    call=None,
) -> int:
    """Send one turn and feed each event to `on_event`; Ctrl-C asks the gateway to cancel.
    With `on_approval`, each approval_request is asked about while the stream goes on. `call`:
    the turn's Chat call when already sent."""
    if call is None:
        call = stub.Chat(request, metadata=call_metadata(settings))
    loop = asyncio.get_running_loop()
    cancel_sent = False
    cancelling: list[asyncio.Task] = []  # held so the task is not collected before it runs

    def request_cancel() -> None:
        nonlocal cancel_sent
        if not cancel_sent:
            cancel_sent = True
            sys.stderr.write("\n· cancelling…\n")
            cancelling.append(loop.create_task(stub.Cancel(gateway_pb2.CancelRequest(session_id=request.session_id), metadata=call_metadata(settings), timeout=10)))

    loop.add_signal_handler(signal.SIGINT, request_cancel)
    exit_code = EXIT_OK
    questions: list[asyncio.Task] = []
    try:
        async for event in call:
            on_event(event)
            kind = event.WhichOneof("payload")
            if kind == "error":
                exit_code = EXIT_SERVER_ERROR
            if on_approval is not None:
                on_approval.notice(event)
                if kind == "approval_request":
                    questions.append(asyncio.create_task(on_approval.ask(event)))
    except grpc.aio.AioRpcError as err:
        raise rpc_failure(err, "gateway", settings) from None
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        # A question still open holds a thread reading stdin: let it finish before the next prompt.
        if questions:
            await asyncio.gather(*questions, return_exceptions=True)
    return exit_code


async def run_chat(args) -> int:
    settings = load_settings()
    session_id = args.session or new_id("s")
    options = gateway_pb2.ChatOptions(max_iterations=args.max_iterations, model=args.model, mode=args.mode,
                                      approval_tools=args.require_approval, token_budget=args.token_budget,
                                      session_token_budget=args.session_token_budget, plan=args.plan,
                                      if_busy=args.if_busy, permission_mode=args.permission_mode, agent=args.agent)
    if args.allow_tool or args.deny_tool:
        options.tools.CopyFrom(common_pb2.ToolPolicy(allow=args.allow_tool, deny=args.deny_tool))
    interactive = sys.stdin.isatty()
    one_shot = args.message is not None
    render: Callable[[common_pb2.Event], None]
    if args.json:
        def render(e: common_pb2.Event) -> None:
            print_json(event_to_json(e))
    else:
        # One-shot without a terminal to ask at: print how to decide from another shell.
        render = HumanRenderer(approval_hint=one_shot and not interactive)
    if args.attach:
        if args.message is not None or args.session:
            raise CliError("--attach SESSION follows a running turn: give no message and no --session", EXIT_USAGE)
        from agentmesh.cli.activity import attach_turn

        return await attach_turn(settings, args.attach, render)
    async with channel_to(settings, "gateway") as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        # --json leaves decisions to whoever reads the events (`agentmesh approvals ...`).
        prompter = ApprovalPrompter(stub, settings) if not args.json and (interactive or not one_shot) else None
        if one_shot:
            request = gateway_pb2.ChatRequest(session_id=session_id, message=args.message, options=options)
            return await stream_turn(stub, settings, request, render, prompter)
        if interactive:
            prompter = ApprovalPrompter(stub, settings, routed=True) if prompter is not None else None
            return await _terminal_repl(stub, settings, session_id, options, render, prompter)
        return await _repl(stub, settings, session_id, options, render, prompter)


async def _repl(stub, settings: Settings, session_id: str, options, render, prompter=None) -> int:
    state = ReplState(session_id, options)
    commands = ReplCommands(stub, settings, state)
    sys.stderr.write(f"session {session_id} · empty line or Ctrl-D to leave · Ctrl-C cancels a running turn · /help\n")
    exit_code = EXIT_OK
    while True:
        try:
            line = await asyncio.to_thread(input, "you> ")
        except EOFError:
            return exit_code
        if not line.strip():
            return exit_code
        message = commands.message_of(line)
        if message is None:
            await commands.run(line)
            continue
        request = gateway_pb2.ChatRequest(session_id=state.session_id, message=message, options=state.options)
        try:
            exit_code = await stream_turn(stub, settings, request, render, prompter)
        except CliError as exc:
            sys.stderr.write(f"agentmesh: {exc}\n")
            exit_code = exc.exit_code


class TerminalLines:
    """The terminal's lines, read by one thread for the whole REPL, so a line typed while a turn
    runs is seen at once (an interruption, or the answer to an approval question)."""

    def __init__(self, stream: TextIO = sys.stdin):
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def read() -> None:
            while True:
                line = stream.readline()
                loop.call_soon_threadsafe(self._queue.put_nowait, line.rstrip("\n") if line else None)
                if not line:
                    return

        threading.Thread(target=read, name="terminal-lines", daemon=True).start()

    async def get(self) -> str | None:
        """The next line; None at end of input."""
        return await self._queue.get()

    def put_back(self, line: str | None) -> None:
        """A line taken but not used: it is read again before anything newer."""
        rest = []
        while not self._queue.empty():
            rest.append(self._queue.get_nowait())
        for item in (line, *rest):
            self._queue.put_nowait(item)


# Written (on stderr) once the turn runs at the gateway: a line typed from then on interrupts it.
READY_TO_INTERRUPT = "· working — type to interrupt, Ctrl-C to cancel"


async def _terminal_repl(stub, settings: Settings, session_id: str, options, render, prompter=None) -> int:
    """The REPL at a terminal: typing while the agent works interrupts the turn with that text
    (if_busy "interrupt": the finished steps stay, the new message goes on from them); a line
    starting with "/" is a command (repl_commands.py), never sent to the model."""
    state = ReplState(session_id, options)
    commands = ReplCommands(stub, settings, state)
    sys.stderr.write(f"session {session_id} · empty line or Ctrl-D to leave · Ctrl-C cancels a running turn · "
                     "type while the agent works to interrupt it · /help\n")
    lines = TerminalLines()
    exit_code = EXIT_OK
    line: str | None = None
    call = None  # the next turn's Chat, when typing already sent it (with its message)
    next_message = ""
    while True:
        if call is None:
            sys.stderr.write("you> ")
            sys.stderr.flush()
            line = await lines.get()
            if line is None or not line.strip():
                return exit_code
            message = commands.message_of(line)
            if message is None:
                await commands.run(line)
                continue
        else:
            message = next_message
        interrupting = gateway_pb2.ChatOptions()
        interrupting.CopyFrom(state.options)
        interrupting.if_busy = "interrupt"
        request = gateway_pb2.ChatRequest(session_id=state.session_id, message=message,
                                          options=interrupting if call is not None else state.options)
        started = asyncio.Event()

        def show(event: common_pb2.Event, started: asyncio.Event = started) -> None:
            render(event)
            if event.WhichOneof("payload") == "run_started" and not started.is_set():
                started.set()
                sys.stderr.write(READY_TO_INTERRUPT + "\n")
                sys.stderr.flush()

        turn = asyncio.create_task(stream_turn(stub, settings, request, show, prompter, call=call))
        call = None
        ended = False
        state.busy = True
        while not turn.done():
            typed = asyncio.create_task(lines.get())
            done, _ = await asyncio.wait({turn, typed}, return_when=asyncio.FIRST_COMPLETED)
            if typed not in done:
                typed.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await typed
                if not typed.cancelled():  # a line came in just as the turn ended: keep it for the prompt
                    lines.put_back(typed.result())
                break
            line = typed.result()
            if line is None:
                ended = True
                break
            if (prompter is not None and prompter.take_line(line)) or not line.strip() or call is not None:
                continue
            typed_message = commands.message_of(line)
            if typed_message is None:
                await commands.run(line)
                continue
            sys.stderr.write("\n· interrupting…\n")
            next_message = typed_message
            interrupting = gateway_pb2.ChatOptions()
            interrupting.CopyFrom(state.options)
            interrupting.if_busy = "interrupt"
            request = gateway_pb2.ChatRequest(session_id=state.session_id, message=typed_message, options=interrupting)
            call = stub.Chat(request, metadata=call_metadata(settings))
        try:
            exit_code = await turn
        except CliError as exc:
            sys.stderr.write(f"agentmesh: {exc}\n")
            exit_code = exc.exit_code
        state.busy = False
        if ended:
            return exit_code
