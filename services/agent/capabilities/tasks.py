"""A session's task board: tasks with dependencies, as plain data (no I/O).

A task is `pending`, `in_progress`, `done` or `cancelled`. It is **blocked** while any task it is
`blocked_by` is not done; completing a task unblocks its dependents. A blocked task cannot be
started or completed, and a dependency that would close a cycle is refused. The board is saved
whole, as JSON (task_tools.py keeps it in the session's transcript).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

PENDING, IN_PROGRESS, DONE, CANCELLED = "pending", "in_progress", "done", "cancelled"
STATUSES = (PENDING, IN_PROGRESS, DONE, CANCELLED)
OPEN = (PENDING, IN_PROGRESS)
MAX_TASKS = 200
MAX_SUBJECT_CHARS = 200
MAX_DESCRIPTION_CHARS = 4000
MAX_OWNER_CHARS = 100
_MARK = {PENDING: " ", IN_PROGRESS: "~", DONE: "x", CANCELLED: "-"}


class BoardError(ValueError):
    """A change the board refuses; the message is for the model."""


@dataclass
class Task:
    id: int
    subject: str
    description: str = ""
    status: str = PENDING
    owner: str = ""
    blocked_by: list[int] = field(default_factory=list)


@dataclass
class Board:
    tasks: dict[int, Task] = field(default_factory=dict)
    next_id: int = 1

    # --- reading ------------------------------------------------------------------------------

    def get(self, task_id: int) -> Task:
        task = self.tasks.get(task_id)
        if task is None:
            known = ", ".join(f"#{i}" for i in self.tasks) or "none yet"
            raise BoardError(f"there is no task #{task_id} (tasks: {known})")
        return task

    def waiting_on(self, task: Task) -> list[int]:
        """The blockers that are not done yet."""
        return [b for b in task.blocked_by if b in self.tasks and self.tasks[b].status != DONE]

    def dependents(self, task_id: int) -> list[int]:
        return [t.id for t in self.tasks.values() if task_id in t.blocked_by]

    def open_tasks(self) -> list[Task]:
        return [t for t in self.tasks.values() if t.status in OPEN]

    def line(self, task: Task) -> str:
        waiting = self.waiting_on(task)
        extra = f" (blocked by {', '.join(f'#{b}' for b in waiting)})" if waiting and task.status in OPEN else ""
        owner = f" @{task.owner}" if task.owner else ""
        return f"[{_MARK[task.status]}] #{task.id} {task.subject}{owner} — {task.status}{extra}"

    def render(self) -> str:
        """One line per task: `[x] #1 subject — done`, `[ ] #3 subject — pending (blocked by #2)`."""
        if not self.tasks:
            return "(no tasks)"
        return "\n".join(self.line(t) for t in self.tasks.values())

    def counts(self) -> dict[str, int]:
        return {s: sum(1 for t in self.tasks.values() if t.status == s) for s in STATUSES}

    # --- changing -----------------------------------------------------------------------------

    def create(self, subject: str, description: str = "", blocked_by: Iterable[int] = ()) -> Task:
        if len(self.tasks) >= MAX_TASKS:
            raise BoardError(f"the board already holds {MAX_TASKS} tasks, its limit; cancel or finish some first")
        subject = _text(subject, "subject", MAX_SUBJECT_CHARS, required=True)
        description = _text(description, "description", MAX_DESCRIPTION_CHARS)
        blockers = self._known(blocked_by)
        task = Task(id=self.next_id, subject=subject, description=description, blocked_by=blockers)
        self.tasks[task.id] = task
        self.next_id += 1
        return task

    def update(self, task_id: int, *, status: str | None = None, owner: str | None = None,
               subject: str | None = None, description: str | None = None,
               add_blocked_by: Iterable[int] = (), remove_blocked_by: Iterable[int] = ()) -> Task:
        """All or nothing: a refused change leaves the task as it was."""
        task = self.get(task_id)
        blockers = [b for b in task.blocked_by if b not in set(remove_blocked_by)]
        for b in self._known(add_blocked_by):
            if b == task_id:
                raise BoardError(f"task #{task_id} cannot depend on itself")
            if b not in blockers:
                cycle = self._path(b, task_id)
                if cycle:
                    chain = " → ".join(f"#{i}" for i in [task_id, *cycle])
                    raise BoardError(f"#{task_id} cannot wait for #{b}: that would close a cycle ({chain})")
                blockers.append(b)
        if status is not None:
            if status not in STATUSES:
                raise BoardError(f"status {status!r} is not one of {', '.join(STATUSES)}")
            waiting = [b for b in blockers if b in self.tasks and self.tasks[b].status != DONE]
            if status in (IN_PROGRESS, DONE) and waiting:
                raise BoardError(f"task #{task_id} is blocked by {', '.join(f'#{b}' for b in waiting)}: finish "
                                 "those first, or remove the dependency")
        new_subject = _text(subject, "subject", MAX_SUBJECT_CHARS, required=True) if subject is not None else None
        new_description = _text(description, "description", MAX_DESCRIPTION_CHARS) if description is not None else None
        new_owner = _text(owner, "owner", MAX_OWNER_CHARS) if owner is not None else None
        task.blocked_by = blockers
        if status is not None:
            task.status = status
        if new_subject is not None:
            task.subject = new_subject
        if new_description is not None:
            task.description = new_description
        if new_owner is not None:
            task.owner = new_owner
        return task

    def _known(self, ids: Iterable[int]) -> list[int]:
        out: list[int] = []
        for i in ids:
            self.get(i)
            if i not in out:
                out.append(i)
        return out

    def _path(self, start: int, target: int) -> list[int]:
        """A chain of blocked_by links from `start` to `target` ([] when there is none)."""
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            if node == target:
                return path
            if node in seen:
                continue
            seen.add(node)
            stack.extend((b, [*path, b]) for b in self.tasks[node].blocked_by if b in self.tasks)
        return []

    # --- storage ------------------------------------------------------------------------------

    def to_json(self) -> str:
        return json.dumps({"next_id": self.next_id, "tasks": [asdict(t) for t in self.tasks.values()]})

    @classmethod
    def from_json(cls, text: str) -> "Board":
        data: dict[str, Any] = json.loads(text)
        tasks = {int(t["id"]): Task(id=int(t["id"]), subject=str(t["subject"]), description=str(t.get("description", "")),
                                    status=str(t.get("status", PENDING)), owner=str(t.get("owner", "")),
                                    blocked_by=[int(b) for b in t.get("blocked_by", [])])
                 for t in data.get("tasks", [])}
        return cls(tasks=tasks, next_id=int(data.get("next_id", max(tasks, default=0) + 1)))


def _text(value: str | None, name: str, limit: int, *, required: bool = False) -> str:
    text = (value or "").strip()
    if required and not text:
        raise BoardError(f"'{name}' is empty")
    if len(text) > limit:
        raise BoardError(f"'{name}' is {len(text)} characters; at most {limit}")
    return text
