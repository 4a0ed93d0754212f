"""A2A tasks as the gateways' task store writes them (docs/api.md, "Open protocols"): kept here so
that `tasks/get` answers on any gateway replica, not only on the one that ran the turn.

Documents (ports.DocumentStore): kind "a2a_task", keyed by the task id, holding the task as the
a2a-sdk serialises it (opaque here, bounded). A namespace keeps its last MAX_TASKS tasks: an
index document (kind "a2a_task_index") lists the ids in the order they were first written, and
the oldest is deleted past the bound. (Two memory replicas creating tasks of one namespace in the
same instant may each miss the other's id in the index; such a task is then never evicted — a
leak of one small document, not a loss.)
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Callable

from agentmesh.errors import InvalidArgument, NotFound
from agentmesh.ids import validate_namespace
from agentmesh.memory.ports import DocumentStore

KIND = "a2a_task"
INDEX_KIND = "a2a_task_index"
INDEX_KEY = "ids"
MAX_TASKS = 1000
MAX_TASK_CHARS = 512 * 1024
TASK_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def _check_id(task_id: str) -> str:
    if not TASK_ID.match(task_id):
        raise InvalidArgument(f"task id {task_id[:64]!r} must be 1-128 letters, digits, '.', '_', ':' or '-'")
    return task_id


class A2aTasks:
    def __init__(self, documents: DocumentStore, *, max_tasks: int = MAX_TASKS, clock: Callable[[], float] = time.time):
        self._documents = documents
        self._max = max_tasks
        self._clock = clock
        self._lock = asyncio.Lock()  # the index's read-modify-write, within this replica

    async def put(self, namespace: str, task_id: str, task_json: str) -> bool:
        """Store (or replace) the task; True when it is new."""
        namespace = validate_namespace(namespace or "default")
        _check_id(task_id)
        if len(task_json) > MAX_TASK_CHARS:
            raise InvalidArgument(f"task {task_id!r} is {len(task_json)} characters; at most {MAX_TASK_CHARS}")
        created = await self._documents.get_document(KIND, namespace, task_id) is None
        await self._documents.put_document(KIND, namespace, task_id, {
            "task_id": task_id, "task_json": task_json, "updated_at": round(self._clock(), 6)})
        if created:
            async with self._lock:
                index = await self._documents.get_document(INDEX_KIND, namespace, INDEX_KEY) or {"ids": []}
                ids = [i for i in index["ids"] if i != task_id] + [task_id]
                for evicted in ids[:-self._max]:
                    await self._documents.delete_document(KIND, namespace, evicted)
                await self._documents.put_document(INDEX_KIND, namespace, INDEX_KEY, {"ids": ids[-self._max:]})
        return created

    async def get(self, namespace: str, task_id: str) -> tuple[str, float]:
        """The task's JSON and when it was last written; NotFound when there is none."""
        namespace = validate_namespace(namespace or "default")
        body = await self._documents.get_document(KIND, namespace, _check_id(task_id))
        if body is None:
            raise NotFound(f"namespace {namespace!r} has no A2A task {task_id!r}")
        return str(body["task_json"]), float(body.get("updated_at", 0.0))
