"""`agentmesh tasks SESSION`: a session's task board, as the agent last saved it (the latest
`kind: "tasks"` entry of its transcript, read through the gateway)."""

from __future__ import annotations

import json
from typing import Any

import grpc

from agentmesh.cli.common import EXIT_OK, CliError, call_metadata, channel_to, load_settings, print_json, rpc_failure
from agentmesh.clients.gateway import GatewayClient
from agentmesh.config import Settings
from agentmesh.v1 import gateway_pb2_grpc, sessions_pb2

TASKS_KIND = "tasks"
_MARK = {"pending": " ", "in_progress": "~", "done": "x", "cancelled": "-"}
_ORDER = ("done", "in_progress", "pending", "cancelled")


def register(subparsers) -> None:
    tasks = subparsers.add_parser("tasks", help="a session's task board")
    tasks.add_argument("session_id")
    tasks.add_argument("--json", action="store_true", help="the board as JSON")
    tasks.set_defaults(func=show_tasks)


def with_blocked(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    status = {t["id"]: t.get("status", "pending") for t in tasks}
    return [{**t, "blocked": any(status.get(b) != "done" for b in t.get("blocked_by", []))} for t in tasks]


def render(tasks: list[dict[str, Any]]) -> list[str]:
    lines = []
    status = {t["id"]: t.get("status", "pending") for t in tasks}
    for t in tasks:
        state = t.get("status", "pending")
        waiting = [b for b in t.get("blocked_by", []) if b in status and status[b] != "done"]
        blocked = f" (blocked by {', '.join(f'#{b}' for b in waiting)})" if waiting and state in ("pending", "in_progress") else ""
        owner = f" @{t['owner']}" if t.get("owner") else ""
        lines.append(f"[{_MARK.get(state, '?')}] #{t['id']} {t['subject']}{owner} — {state}{blocked}")
    counts = [(s, sum(1 for t in tasks if t.get("status") == s)) for s in _ORDER]
    summary = ", ".join(f"{n} {s.replace('_', ' ')}" for s, n in counts if n)
    lines.append(f"{len(tasks)} {'task' if len(tasks) == 1 else 'tasks'}: {summary}")
    return lines


async def fetch_board(stub: gateway_pb2_grpc.GatewayStub, settings: Settings, session_id: str) -> list[dict[str, Any]]:
    """The session's board as the agent last saved it; [] when it has none."""
    latest = None
    after = 0
    try:
        while True:
            page = await stub.GetTranscript(
                sessions_pb2.GetTranscriptRequest(session_id=session_id, page_size=1000, after_seq=after),
                metadata=call_metadata(settings), timeout=30,
            )
            latest = next((m for m in reversed(page.messages) if m.kind == TASKS_KIND), latest)
            after = page.next_after_seq
            if not after:
                break
    except grpc.aio.AioRpcError as err:
        raise rpc_failure(err, "gateway", settings) from None
    try:
        return with_blocked(json.loads(latest.content)["tasks"]) if latest is not None else []
    except (ValueError, KeyError, TypeError):
        raise CliError(f"the task board of session {session_id} is unreadable (entry {latest.seq if latest is not None else '?'})") from None


async def show_tasks(args) -> int:
    settings = load_settings()
    async with channel_to(settings, "gateway") as channel:
        tasks = await fetch_board(GatewayClient(channel).stub, settings, args.session_id)
    if args.json:
        print_json({"session_id": args.session_id, "tasks": tasks})
    elif not tasks:
        print(f"session {args.session_id} has no tasks yet — a deep turn (agentmesh chat --mode deep) plans into its board")
    else:
        print("\n".join(render(tasks)))
    return EXIT_OK
