"""Retention and erasure, memory's part (docs/memory.md#retention, #erasure).

A namespace's retention (`NamespaceRecord.transcripts_days` and the rest; 0 = keep) is applied
by bounded passes: `sweep` removes at most `max_items` expired memories and usage records
itself, and names at most `max_items` expired sessions, whose removal the gateway does — the
workspace first (the tools service), then the session — because memory does not call the tools
service. Everything a pass names is still there until removed, so a pass cut short (a crash, a
restart, a lost leader) is simply found again by the next one.

What a pass cannot find again by itself is where its walk was: sessions are walked newest
first from the cutoff, and a session used last week but created last year would be looked at
again by every pass. So the walk's page token (and the usage scroll's offset) are kept in a
document per namespace, written after each pass: a restarted sweep continues where the last
pass ended, and a pass over `max_items` records always moves the walk on.

`erase_user` is the same for one person's records: the memories they made and the usage of
their sessions go first (their sessions are what link those to them), then the gateway removes
the sessions this names.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentmesh.errors import InvalidArgument
from agentmesh.ids import PARENT_SESSION_LABEL, validate_id, validate_namespace
from agentmesh.memory.blocks import erase_user_blocks
from agentmesh.memory.namespaces import NamespaceRecord, Namespaces
from agentmesh.memory.ports import DocumentStore, MemoryStore, PointFilter, SessionStore, UsageStore
from agentmesh.memory.recall import WATERMARK, index_namespace
from agentmesh.memory.transcript_records import SessionRecord
from agentmesh.memory.transcripts import Transcripts

__all__ = ["ErasePass", "Retention", "RetentionStore", "SweepPass"]

DAY_S = 86400.0
CURSOR_KIND = "retention-cursor"  # a namespace's walk, key "sweep"
# One document per namespace with a retention, all under one namespace so that the sweep can
# list them without a listing of namespaces in the store port.
INDEX_KIND = "retention-index"
INDEX_NAMESPACE = "default"
MAX_ITEMS = 10_000
_SCAN_PAGE = 500
MAX_USER_CHARS = 256


class RetentionStore(SessionStore, MemoryStore, UsageStore, Protocol):
    """What retention removes from: sessions (read), memories and usage records."""


@dataclass
class SweepPass:
    memories_removed: int = 0
    usage_removed: int = 0
    expired_sessions: list[str] = field(default_factory=list)
    expired_workspaces: list[str] = field(default_factory=list)
    done: bool = True


@dataclass
class ErasePass:
    memories_removed: int = 0
    usage_removed: int = 0
    sessions: list[str] = field(default_factory=list)
    done: bool = True


def _limit(max_items: int) -> int:
    if max_items < 0 or max_items > MAX_ITEMS:
        raise InvalidArgument(f"max_items must be between 0 and {MAX_ITEMS}, got {max_items}", field="max_items")
    return max_items


class Retention:
    def __init__(self, store: RetentionStore, documents: DocumentStore, namespaces: Namespaces,
                 transcripts: Transcripts, max_items: int):
        self._store = store
        self._documents = documents
        self._namespaces = namespaces
        self._transcripts = transcripts
        self._max_items = max_items

    async def kept_namespaces(self) -> list[str]:
        """The namespaces that have a retention: the ones a sweep of every namespace visits."""
        return [key for key, _ in await self._documents.list_documents(INDEX_KIND, INDEX_NAMESPACE)]

    async def note(self, record: NamespaceRecord) -> None:
        """Keep the index of namespaces with a retention in step with a namespace's settings."""
        if any(record.retention_days()):
            await self._documents.put_document(INDEX_KIND, INDEX_NAMESPACE, record.namespace, {"at": record.updated_at})
        else:
            await self._documents.delete_document(INDEX_KIND, INDEX_NAMESPACE, record.namespace)

    # ------------------------------------------------------------------ sweep

    async def sweep(self, namespace: str, now: float, max_items: int, workspaces_removed: list[str],
                    only_note: bool = False) -> SweepPass:
        namespace = validate_namespace(namespace)
        limit = _limit(max_items) or self._max_items
        now = now or time.time()
        record = await self._namespaces.get(namespace)
        # The caller removed these sessions' workspaces after the last pass named them: noted on
        # the session, so the next walk does not name them again (until they are used again).
        for session_id in workspaces_removed:
            await self._transcripts.note_workspace_removed(session_id, now)
        if only_note:
            return SweepPass(done=False)
        cursor = await self._documents.get_document(CURSOR_KIND, namespace, "sweep") or {}
        out = SweepPass()
        if record.memories_days:
            out.memories_removed, more = await self._expire_memories(namespace, now - record.memories_days * DAY_S, limit)
            out.done &= not more
        if record.usage_days:
            removed, offset = await self._expire_usage(namespace, now - record.usage_days * DAY_S, limit,
                                                       cursor.get("usage") or None)
            out.usage_removed, cursor["usage"] = removed, offset
            out.done &= not offset
        if record.transcripts_days or record.workspaces_days:
            cursor["sessions"] = await self._walk_sessions(namespace, record, now, limit, cursor.get("sessions", ""), out)
            out.done &= not cursor["sessions"]
        await self._documents.put_document(CURSOR_KIND, namespace, "sweep", cursor)
        return out

    async def _expire_memories(self, namespace: str, cutoff: float, limit: int) -> tuple[int, bool]:
        # Removed ones no longer match: every pass starts from the first page, no cursor needed.
        page, more = await self._store.scroll_memories(PointFilter(namespace, created_before=cutoff), limit, None)
        await self._store.delete_memories_by_ids(namespace, [pid for pid, _ in page])
        return len(page), bool(more)

    async def _expire_usage(self, namespace: str, cutoff: float, limit: int, offset: str | None) -> tuple[int, str]:
        # Usage records of every namespace are one collection scrolled by time: the offset keeps
        # other namespaces' old records from being looked at again by each pass.
        page, next_offset = await self._store.scroll_usage(0.0, cutoff, limit, offset)
        ids = [p["id"] for p in page if (p.get("namespace") or "default") == namespace]
        await self._store.delete_usage(ids)
        return len(ids), next_offset

    async def _walk_sessions(self, namespace: str, record: NamespaceRecord, now: float, limit: int,
                             token: str, out: SweepPass) -> str:
        t_cut = now - record.transcripts_days * DAY_S if record.transcripts_days else None
        w_cut = now - record.workspaces_days * DAY_S if record.workspaces_days else None
        if not token:
            # A session last used before a cutoff was created before it too: start there.
            start = max(c for c in (t_cut, w_cut) if c is not None)
            token = f"{start!r}:0"
        sessions, token = await self._transcripts.list_sessions(min(limit, _SCAN_PAGE), token, frozenset([namespace]))
        for s in sessions:
            if t_cut is not None and s.updated_at <= t_cut:
                out.expired_sessions.append(s.session_id)
            elif w_cut is not None and s.updated_at <= w_cut and s.workspace_removed_at < s.updated_at:
                out.expired_workspaces.append(s.session_id)
        return token

    # ------------------------------------------------------------------ deleted sessions

    async def session_tree(self, session_id: str) -> list[tuple[str, str]]:
        """(namespace, id) of the session and of the sessions started on its behalf (sub-agents),
        read before they are deleted: what `forget_conversations` needs afterwards."""
        found: list[tuple[str, str]] = []
        todo = [validate_id(session_id)]
        while todo:
            current = todo.pop()
            payload = await self._store.get_session(current)
            if payload is not None:
                found.append((payload.get("namespace") or "default", current))
                todo += await self._store.child_sessions(current, PARENT_SESSION_LABEL)
        return found

    async def forget_conversations(self, sessions: list[tuple[str, str]]) -> None:
        """Deleted sessions' entries in their namespace's conversation index, and their watermarks:
        a search never answered them (it checks each hit's session), but a deleted conversation —
        by a person, retention or an erasure — must not stay on disk in the index either."""
        for namespace, session_id in sessions:
            await self._store.delete_memories_by_filter(PointFilter(index_namespace(namespace),
                                                                    source_session_id=session_id))
            await self._documents.delete_document(WATERMARK, namespace, session_id)

    # ------------------------------------------------------------------ erasure

    async def erase_user(self, namespace: str, user: str, max_items: int) -> ErasePass:
        namespace = validate_namespace(namespace or "default")
        if not user.strip() or len(user) > MAX_USER_CHARS:
            raise InvalidArgument(f"user must name a principal (e.g. 'user:alice') of at most {MAX_USER_CHARS} "
                                  "characters", field="user")
        limit = _limit(max_items) or self._max_items
        sessions = await self._sessions_of(namespace, user)
        out = ErasePass()
        ids = {s.session_id for s in sessions}
        out.memories_removed, more_memories = await self._erase_memories(namespace, user, ids, limit)
        out.usage_removed, more_usage = await self._erase_usage(namespace, ids, limit)
        # Their per-user memory blocks (a handful of documents: no bound needed).
        await erase_user_blocks(self._documents, namespace, user)
        # Sessions last: while any of their memories or usage records is left, they are what
        # says whose those are.
        out.sessions = [] if (more_memories or more_usage) else [s.session_id for s in sessions[:limit]]
        out.done = not (more_memories or more_usage or len(sessions) > limit)
        return out

    async def _sessions_of(self, namespace: str, user: str) -> list[SessionRecord]:
        found, token = [], ""
        while True:
            page, token = await self._transcripts.list_sessions(_SCAN_PAGE, token, frozenset([namespace]))
            found += [s for s in page if s.created_by == user]
            if not token:
                return found

    async def _erase_memories(self, namespace: str, user: str, sessions: set[str], limit: int) -> tuple[int, bool]:
        doomed: list[str] = []
        offset: str | None = None
        while True:
            page, offset = await self._store.scroll_memories(PointFilter(namespace), _SCAN_PAGE, offset)
            doomed += [pid for pid, p in page if _made_by(p, user, sessions)]
            if not offset or len(doomed) > limit:
                break
        await self._store.delete_memories_by_ids(namespace, doomed[:limit])
        return min(len(doomed), limit), len(doomed) > limit

    async def _erase_usage(self, namespace: str, sessions: set[str], limit: int) -> tuple[int, bool]:
        if not sessions:
            return 0, False
        doomed: list[str] = []
        offset: str | None = None
        while True:
            page, offset = await self._store.scroll_usage(0.0, 0.0, _SCAN_PAGE, offset)
            doomed += [p["id"] for p in page if (p.get("namespace") or "default") == namespace
                       and (p.get("session_id") in sessions or p.get("root_session_id") in sessions)]
            if not offset or len(doomed) > limit:
                break
        await self._store.delete_usage(doomed[:limit])
        return min(len(doomed), limit), len(doomed) > limit


def _made_by(payload: dict[str, Any], user: str, sessions: set[str]) -> bool:
    return payload.get("created_by") == user or payload.get("source_session_id") in sessions
