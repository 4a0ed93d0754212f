"""The turns of `agentmesh chat`: send one (or a REPL of them), show its events, ask about held
tool calls, and cancel on Ctrl-C. chat.py holds the command's arguments."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
from typing import Callable, TextIO

import grpc

from agentmesh.cli.approvals import send_decision
from agentmesh.cli.chat import READY_TO_INTERRUPT, parse_answer, turn_exit_code
from agentmesh.cli.common import (
    EXIT_OK,
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
from agentmesh.clients.gateway import GatewayClient
from agentmesh.config import Settings
from agentmesh.errors import InvalidArgument
from agentmesh.ids import new_id, validate_id
from agentmesh.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc


async def read_line(prompt: str) -> str:
    """input(prompt) without holding up the exit: read in a daemon thread of its own, not
    asyncio's executor, whose threads the interpreter joins on the way out — Ctrl-C at the
    prompt (stdin a pipe) then waited for a line that might never come. EOFError at the end."""
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[str] = loop.create_future()

    def settle(line: str | None, error: BaseException | None) -> None:
        if answer.done():  # given up on (Ctrl-C): nobody reads this line
            return
        if error is not None:
            answer.set_exception(error)
        else:
            answer.set_result(line or "")

    def read() -> None:
        try:
            line, error = input(prompt), None
        except (EOFError, OSError, ValueError) as exc:  # ValueError: stdin closed under us
            line, error = None, exc if isinstance(exc, EOFError) else EOFError(str(exc))
        with contextlib.suppress(RuntimeError):  # the loop has closed: the command is over
            loop.call_soon_threadsafe(settle, line, error)

    threading.Thread(target=read, name="read-line", daemon=True).start()
    return await answer


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
            return await read_line(prompt)
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

    async def send_cancel() -> None:
        try:
            await stub.Cancel(gateway_pb2.CancelRequest(session_id=request.session_id),
                              metadata=call_metadata(settings), timeout=10)
        except grpc.aio.AioRpcError as err:  # the turn's own stream still says how it ended
            sys.stderr.write(f"· the cancel was not taken: {rpc_failure(err, 'gateway', settings)}\n")

    def request_cancel() -> None:
        nonlocal cancel_sent
        if not cancel_sent:
            cancel_sent = True
            sys.stderr.write("\n· cancelling…\n")
            cancelling.append(loop.create_task(send_cancel()))

    loop.add_signal_handler(signal.SIGINT, request_cancel)
    stop_reason: str | None = None
    failed = False
    questions: list[asyncio.Task] = []
    try:
        async for event in call:
            on_event(event)
            kind = event.WhichOneof("payload")
            if kind == "error":
                failed = True
            elif kind == "run_finished":
                stop_reason = event.run_finished.stop_reason or "completed"
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
    return turn_exit_code(stop_reason, failed, cancel_sent)


async def chat(args) -> int:
    """`agentmesh chat` (chat.py parsed the arguments): one turn, attach, or a REPL."""
    settings = load_settings()
    try:  # a malformed id is the command line's mistake: say so before anything is sent
        session_id = validate_id(args.session, "--session") if args.session else new_id("s")
        if args.attach:
            validate_id(args.attach, "--attach")
    except InvalidArgument as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    options = gateway_pb2.ChatOptions(max_iterations=args.max_iterations, model=args.model, mode=args.mode,
                                      approval_tools=args.require_approval, token_budget=args.token_budget,
                                      session_token_budget=args.session_token_budget, plan=args.plan,
                                      if_busy=args.if_busy, permission_mode=args.permission_mode, agent=args.agent)
    if args.allow_tool or args.deny_tool:
        options.tools.CopyFrom(common_pb2.ToolPolicy(allow=args.allow_tool, deny=args.deny_tool))
    interactive = sys.stdin.isatty()
    one_shot = args.message is not None
    if args.image and not one_shot:
        raise CliError("--image goes with a MESSAGE: agentmesh chat \"what is this?\" --image FILE", EXIT_USAGE)
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
    if getattr(args, "submit", False):
        if args.message is None:
            raise CliError("--submit MESSAGE starts a run: give the message", EXIT_USAGE)
        from agentmesh.cli.runs import submit

        return await submit(args, gateway_pb2.ChatRequest(session_id=session_id, message=args.message, options=options))
    async with channel_to(settings, "gateway") as channel:
        stub = GatewayClient(channel).stub
        # --json leaves decisions to whoever reads the events (`agentmesh approvals ...`).
        prompter = ApprovalPrompter(stub, settings) if not args.json and (interactive or not one_shot) else None
        if one_shot:
            request = gateway_pb2.ChatRequest(session_id=session_id, message=args.message, options=options,
                                              images=_images(args.image))
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
            line = await read_line("you> ")
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


def _images(paths: list[str]) -> list[common_pb2.Image]:
    """The --image files as the request's images; the gateway checks their kind and size."""
    images = []
    for path in paths:
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except OSError as exc:
            raise CliError(f"--image {path}: cannot read it ({exc.strerror or exc})", EXIT_USAGE) from None
        images.append(common_pb2.Image(data=data, name=path.rsplit("/", 1)[-1]))
    return images
