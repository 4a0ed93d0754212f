"""The task board as tools the agent executes itself: `task_create`, `task_update`, `task_get`,
`task_list` (the board itself is tasks.py).

Durability: the whole board is appended to the session's transcript as a `kind: "tasks"` entry
after every change (role `system`, content the board's JSON). The latest entry is the board; the
model never sees these entries as messages, compaction never summarises them away, and any
replica, after any restart, reads the board back at the start of the next turn. Each change
also goes to the client as a `task_update` event carrying the whole board.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentmesh.agent.capabilities.tasks import (
    MAX_DESCRIPTION_CHARS,
    MAX_OWNER_CHARS,
    MAX_SUBJECT_CHARS,
    STATUSES,
    Board,
    BoardError,
)
from agentmesh.agent.loop.turn import Capability, TurnContext
from agentmesh.agent.types import ChatMessage, TaskSnapshot, TaskUpdateEvent, ToolCall, ToolOutcome, ToolSpec
from agentmesh.logs import get_logger
from agentmesh.toolargs import ArgumentsSchema

log = get_logger("agentmesh.agent.tasks")

TASKS_KIND = "tasks"
_ID = {"type": "integer", "minimum": 1, "description": "The task's number, as in #3."}
_IDS = {"type": "array", "items": {"type": "integer", "minimum": 1}, "maxItems": 50}

SPECS = (
    ToolSpec(
        name="task_create",
        description=(
            "Add a task to this session's task board. Use the board to plan multi-step work and to track it: one "
            "task per concrete piece of work. `blocked_by` lists tasks that must be done first."
        ),
        parameters={"type": "object", "properties": {
            "subject": {"type": "string", "maxLength": MAX_SUBJECT_CHARS, "description": "A short imperative title."},
            "description": {"type": "string", "maxLength": MAX_DESCRIPTION_CHARS,
                            "description": "Details: what done looks like."},
            "blocked_by": {**_IDS, "description": "Numbers of tasks that must be done before this one."},
        }, "required": ["subject"], "additionalProperties": False},
    ),
    ToolSpec(
        name="task_update",
        description=(
            "Change a task: its status (pending, in_progress, done, cancelled), owner, subject, description, or "
            "dependencies. Mark a task in_progress when you start it and done when it is finished; completing a "
            "task unblocks the tasks waiting for it. A blocked task cannot be started or completed."
        ),
        parameters={"type": "object", "properties": {
            "id": _ID,
            "status": {"type": "string", "enum": list(STATUSES)},
            "owner": {"type": "string", "maxLength": MAX_OWNER_CHARS, "description": "Who works on it."},
            "subject": {"type": "string", "maxLength": MAX_SUBJECT_CHARS},
            "description": {"type": "string", "maxLength": MAX_DESCRIPTION_CHARS},
            "add_blocked_by": {**_IDS, "description": "Tasks this one must now wait for."},
            "remove_blocked_by": {**_IDS, "description": "Dependencies to drop."},
        }, "required": ["id"], "additionalProperties": False},
    ),
    ToolSpec(
        name="task_get",
        description="One task in full: description, status, owner, what it waits for and what waits for it.",
        parameters={"type": "object", "properties": {"id": _ID}, "required": ["id"], "additionalProperties": False},
        read_only=True,
    ),
    ToolSpec(
        name="task_list",
        description="The whole task board, one line per task.",
        parameters={"type": "object", "properties": {}, "additionalProperties": False},
        read_only=True,
    ),
)
NAMES = frozenset(s.name for s in SPECS)
_SCHEMAS = {s.name: ArgumentsSchema(s.name, s.parameters) for s in SPECS}


def latest_board(stored: list[ChatMessage]) -> Board:
    """The board as last saved in a transcript (an empty board when none was)."""
    for m in reversed(stored):
        if m.kind == TASKS_KIND:
            try:
                return Board.from_json(m.content)
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("ignoring a malformed task board entry", seq=m.seq, error=str(exc))
    return Board()


def snapshot(board: Board) -> tuple[TaskSnapshot, ...]:
    return tuple(
        TaskSnapshot(id=t.id, subject=t.subject, description=t.description, status=t.status, owner=t.owner,
                     blocked_by=tuple(t.blocked_by), blocked=bool(board.waiting_on(t)))
        for t in board.tasks.values()
    )


class TaskBoard(Capability):
    def __init__(self, ctx: TurnContext):
        super().__init__(ctx)
        self.board = Board()
        self._saving = asyncio.Lock()  # entries reach the transcript in the order of the changes

    async def prepare_history(self, history: list[ChatMessage]) -> list[ChatMessage]:
        self.board = latest_board(self.ctx.stored)
        return history

    def tools(self) -> list[ToolSpec]:
        return list(SPECS)

    async def execute(self, call: ToolCall) -> ToolOutcome:
        try:
            args = _SCHEMAS[call.name].parse(call.arguments_json)
        except ValueError as exc:
            return ToolOutcome.error(call, "invalid_arguments", f"error: {exc}")
        try:
            output, changed = self._apply(call.name, args)
        except BoardError as exc:
            return ToolOutcome.error(call, "task_refused", f"error: {call.name}: {exc}")
        if changed:
            await self.save()
        return ToolOutcome(call_id=call.call_id, name=call.name, output=output,
                           data={"open": len(self.board.open_tasks()), "tasks": len(self.board.tasks)})

    def _apply(self, name: str, args: dict[str, Any]) -> tuple[str, bool]:
        board = self.board
        if name == "task_create":
            task = board.create(args["subject"], args.get("description", ""), args.get("blocked_by", ()))
            return f"Created {board.line(task)}", True
        if name == "task_update":
            before = board.open_tasks()
            task = board.update(args["id"], status=args.get("status"), owner=args.get("owner"),
                                subject=args.get("subject"), description=args.get("description"),
                                add_blocked_by=args.get("add_blocked_by", ()),
                                remove_blocked_by=args.get("remove_blocked_by", ()))
            unblocked = [t for t in before if t.id != task.id and t.id in board.dependents(task.id)
                         and not board.waiting_on(t)] if task.status == "done" else []
            note = f"; now unblocked: {', '.join(f'#{t.id} {t.subject}' for t in unblocked)}" if unblocked else ""
            return f"Updated {board.line(task)}{note}", True
        if name == "task_get":
            task = board.get(args["id"])
            waits = ", ".join(f"#{b}" for b in task.blocked_by) or "nothing"
            needed_by = ", ".join(f"#{d}" for d in board.dependents(task.id)) or "nothing"
            return (f"{board.line(task)}\nDescription: {task.description or '(none)'}\n"
                    f"Waits for: {waits}. Needed by: {needed_by}."), False
        return board.render(), False

    async def add_plan(self, items: list[str]) -> None:
        """Deep work's plan as tasks, one per item (no dependencies: the model adds those it needs)."""
        for item in items:
            self.board.create(item[:MAX_SUBJECT_CHARS])
        await self.save()

    async def save(self) -> None:
        async with self._saving:
            entry = ChatMessage(role="system", content=self.board.to_json(), run_id=self.ctx.request.run_id,
                                kind=TASKS_KIND)
            await self.ctx.persist([entry])
            self.ctx.emit(TaskUpdateEvent(snapshot(self.board)))

