"""Where each session's reflection stopped, and its runs (the agent's reflection.py does the
work; this keeps its record). One document per session (kind "reflection", in the session's
namespace): `last_seq` — the last transcript entry reflected on — and the latest runs.

A run that finished ("done", or "nothing new") moves the cursor to its `seq_to`, so the next
reflection reads only what came after; a failed run leaves it, so the stretch is tried again.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentmesh.errors import InvalidArgument
from agentmesh.ids import validate_id, validate_namespace
from agentmesh.memory.ports import DocumentStore

KIND = "reflection"
KEEP_RUNS = 50
MOVES_CURSOR = ("done", "nothing new")


class Reflections:
    def __init__(self, documents: DocumentStore):
        self._documents = documents
        self._lock = asyncio.Lock()

    async def state(self, namespace: str, session_id: str) -> dict[str, Any]:
        namespace, session_id = validate_namespace(namespace), validate_id(session_id)
        found = await self._documents.get_document(KIND, namespace, session_id)
        return found or {"session_id": session_id, "last_seq": 0, "runs": []}

    async def record(self, run: dict[str, Any]) -> dict[str, Any]:
        """`run`: a ReflectionRun as a dict (proto field names)."""
        namespace, session_id = validate_namespace(run.get("namespace", "")), validate_id(run.get("session_id", ""))
        status = run.get("status", "")
        if status not in (*MOVES_CURSOR, "failed"):
            raise InvalidArgument(f"a reflection run's status is 'done', 'nothing new' or 'failed', not {status!r}")
        async with self._lock:
            state = await self.state(namespace, session_id)
            if status in MOVES_CURSOR:
                state["last_seq"] = max(int(state["last_seq"]), int(run.get("seq_to", 0)))
            state["runs"] = [run, *state["runs"]][:KEEP_RUNS]
            await self._documents.put_document(KIND, namespace, session_id, state)
        return state

    async def list(self, namespace: str, session_id: str = "", limit: int = 50) -> list[dict[str, Any]]:
        namespace = validate_namespace(namespace)
        if session_id:
            runs: list[dict[str, Any]] = list((await self.state(namespace, session_id))["runs"])
        else:
            runs = [r for _, doc in await self._documents.list_documents(KIND, namespace) for r in doc["runs"]]
        runs.sort(key=lambda r: float(r.get("started_at", 0)), reverse=True)
        return runs[: limit or 50]
