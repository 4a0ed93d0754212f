"""`agentmesh chat`: stream one turn (or a REPL of turns) and show its events."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from typing import Any, TextIO

import grpc

from agentmesh.cli.common import (
    EXIT_OK,
    EXIT_SERVER_ERROR,
    CliError,
    call_metadata,
    channel_to,
    load_settings,
    print_json,
    rpc_failure,
)
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
    chat.set_defaults(func=run_chat)


def event_to_json(event: common_pb2.Event) -> dict[str, Any]:
    """The stable JSON shape of `chat --json`: one object per event, each with a `type`."""
    kind = event.WhichOneof("payload")
    base: dict[str, Any] = {"type": kind, "session_id": event.session_id, "run_id": event.run_id, "seq": event.seq}
    if kind == "run_started":
        base.update(trace_id=event.run_started.trace_id)
    elif kind == "text_delta":
        base.update(text=event.text_delta.text)
    elif kind == "tool_call":
        call = event.tool_call
        try:
            arguments: Any = json.loads(call.arguments_json) if call.arguments_json else {}
        except json.JSONDecodeError:
            arguments = call.arguments_json
        base.update(name=call.name, arguments=arguments, call_id=call.call_id)
    elif kind == "tool_result":
        r = event.tool_result.result
        base.update(
            call_id=r.call_id,
            name=r.name,
            output=r.output,
            is_error=r.is_error,
            exit_code=r.exit_code,
            duration_ms=r.duration_ms,
            truncated=r.truncated,
            error_kind=r.error_kind,
        )
    elif kind == "run_finished":
        f = event.run_finished
        base.update(
            usage={
                "input_tokens": f.usage.input_tokens,
                "output_tokens": f.usage.output_tokens,
                "total_tokens": f.usage.total_tokens,
            },
            iterations=f.iterations,
            final_text=f.final_text,
            trace_id=f.trace_id,
            stop_reason=f.stop_reason,
        )
    elif kind == "error":
        base.update(code=event.error.code, message=event.error.message)
    elif kind == "status":
        base.update(message=event.status.message)
    return base


class HumanRenderer:
    """Readable output: the reply streams on stdout, tool activity is set off by markers."""

    def __init__(self, out: TextIO = sys.stdout):
        self.out = out
        self._in_text = False

    def _line(self, text: str) -> None:
        if self._in_text:
            self.out.write("\n")
            self._in_text = False
        self.out.write(text + "\n")

    def __call__(self, event: common_pb2.Event) -> None:
        kind = event.WhichOneof("payload")
        if kind == "run_started":
            self._line(f"· run {event.run_id} on session {event.session_id}")
        elif kind == "text_delta":
            self.out.write(event.text_delta.text)
            self._in_text = True
        elif kind == "tool_call":
            args = event.tool_call.arguments_json
            self._line(f"→ {event.tool_call.name} {args if len(args) <= 200 else args[:200] + '…'}")
        elif kind == "tool_result":
            r = event.tool_result.result
            mark = "✗" if r.is_error else "←"
            output = r.output.strip().replace("\n", "\n    ")
            if len(output) > 600:
                output = output[:600] + "…"
            self._line(f"{mark} {r.name} ({r.duration_ms:.0f} ms){': ' if output else ''}{output}")
        elif kind == "status":
            self._line(f"· {event.status.message}")
        elif kind == "run_finished":
            f = event.run_finished
            reason = "" if f.stop_reason in ("", "completed") else f" ({f.stop_reason})"
            self._line(
                f"· done{reason}: {f.iterations} model call(s), {f.usage.total_tokens} tokens · trace {f.trace_id}"
            )
        elif kind == "error":
            self._line(f"✗ error {event.error.code}: {event.error.message}")
        self.out.flush()


async def stream_turn(
    stub: gateway_pb2_grpc.GatewayStub,
    settings: Settings,
    request: gateway_pb2.ChatRequest,
    on_event,
) -> int:
    """Send one turn and feed each event to `on_event`; Ctrl-C asks the gateway to cancel."""
    call = stub.Chat(request, metadata=call_metadata(settings))
    loop = asyncio.get_running_loop()
    cancel_sent = False

    def request_cancel() -> None:
        nonlocal cancel_sent
        if not cancel_sent:
            cancel_sent = True
            sys.stderr.write("\n· cancelling…\n")
            loop.create_task(stub.Cancel(gateway_pb2.CancelRequest(session_id=request.session_id), metadata=call_metadata(settings), timeout=10))

    loop.add_signal_handler(signal.SIGINT, request_cancel)
    exit_code = EXIT_OK
    try:
        async for event in call:
            on_event(event)
            if event.WhichOneof("payload") == "error":
                exit_code = EXIT_SERVER_ERROR
    except grpc.aio.AioRpcError as err:
        raise rpc_failure(err, "gateway", settings) from None
    finally:
        loop.remove_signal_handler(signal.SIGINT)
    return exit_code


async def run_chat(args) -> int:
    settings = load_settings()
    session_id = args.session or new_id("s")
    options = gateway_pb2.ChatOptions(max_iterations=args.max_iterations, model=args.model)
    render = (lambda e: print_json(event_to_json(e))) if args.json else HumanRenderer()
    async with channel_to(settings, "gateway") as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        if args.message is not None:
            request = gateway_pb2.ChatRequest(session_id=session_id, message=args.message, options=options)
            return await stream_turn(stub, settings, request, render)
        return await _repl(stub, settings, session_id, options, render)


async def _repl(stub, settings: Settings, session_id: str, options, render) -> int:
    sys.stderr.write(f"session {session_id} · empty line or Ctrl-D to leave · Ctrl-C cancels a running turn\n")
    exit_code = EXIT_OK
    while True:
        try:
            line = await asyncio.to_thread(input, "you> ")
        except EOFError:
            return exit_code
        if not line.strip():
            return exit_code
        request = gateway_pb2.ChatRequest(session_id=session_id, message=line, options=options)
        try:
            exit_code = await stream_turn(stub, settings, request, render)
        except CliError as exc:
            sys.stderr.write(f"agentmesh: {exc}\n")
            exit_code = exc.exit_code
