"""`agentmesh activity`: the tool calls of every running turn as they happen (Gateway.WatchActivity);
and `agentmesh chat --attach SESSION`: follow a session's running turn (Gateway.AttachTurn)."""

from __future__ import annotations

import datetime as dt
import sys
from typing import Callable

import grpc

from agentmesh.cli.common import EXIT_OK, call_metadata, channel_to, load_settings, print_json, rpc_failure, to_dict
from agentmesh.clients.gateway import GatewayClient
from agentmesh.config import Settings
from agentmesh.v1 import common_pb2, gateway_pb2


def register(subparsers) -> None:
    activity = subparsers.add_parser(
        "activity", help="watch the tool calls of every running turn, live",
        description="Tool calls and results of every session's running turns, on every gateway replica, "
                    "as they happen; Ctrl-C stops watching (the turns go on).")
    activity.add_argument("--session", action="append", default=[], metavar="ID", help="only this session (repeatable)")
    activity.add_argument("--json", action="store_true", help="print one JSON object per line")
    activity.set_defaults(func=watch_activity)


def _short(text: str, limit: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe(activity: gateway_pb2.Activity) -> str:
    kind = activity.WhichOneof("payload")
    when = dt.datetime.fromtimestamp(activity.timestamp or 0).strftime("%H:%M:%S")
    head = f"{when} {activity.session_id}"
    if kind == "run_started":
        return f"{head} · run {activity.run_id} started"
    if kind == "tool_call":
        return f"{head} → {activity.tool_call.name} {_short(activity.tool_call.arguments_json)}"
    if kind == "tool_result":
        r = activity.tool_result.result
        return f"{head} {'✗' if r.is_error else '←'} {r.name} ({r.duration_ms:.0f} ms) {_short(r.output)}".rstrip()
    if kind == "approval_request":
        return f"{head} ? {activity.approval_request.name} waits for approval"
    if kind == "run_finished":
        f = activity.run_finished
        return f"{head} · run finished ({f.stop_reason or 'completed'}, {f.usage.total_tokens} tokens)"
    if kind == "error":
        return f"{head} ✗ {activity.error.code}: {activity.error.message}"
    return f"{head} {kind}"


async def watch_activity(args) -> int:
    settings = load_settings()
    request = gateway_pb2.WatchActivityRequest(session_ids=args.session)
    async with channel_to(settings, "gateway") as channel:
        call = GatewayClient(channel).stub.WatchActivity(request, metadata=call_metadata(settings))
        try:
            async for activity in call:
                if activity.WhichOneof("payload") is None:
                    if not args.json:
                        where = f" on {activity.gateway}" if activity.gateway else ""
                        sys.stderr.write(f"· watching{where}; Ctrl-C stops\n")
                    continue
                if args.json:
                    print_json({"type": activity.WhichOneof("payload"), **to_dict(activity)})
                else:
                    print(describe(activity), flush=True)
        except grpc.aio.AioRpcError as err:
            raise rpc_failure(err, "gateway", settings) from None
    return EXIT_OK


async def attach_turn(settings: Settings, session_id: str, render: Callable[[common_pb2.Event], None]) -> int:
    from agentmesh.cli.chat_turns import stream_turn

    async with channel_to(settings, "gateway") as channel:
        stub = GatewayClient(channel).stub
        call = stub.AttachTurn(gateway_pb2.AttachTurnRequest(session_id=session_id), metadata=call_metadata(settings))
        # The same loop as a turn of our own: Ctrl-C cancels the turn we follow.
        return await stream_turn(stub, settings, gateway_pb2.ChatRequest(session_id=session_id), render, call=call)
