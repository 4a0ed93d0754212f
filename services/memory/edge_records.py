"""The embedded store's payload-only records (ports.Store's sessions, transcript messages,
namespace settings and usage records) on Qdrant Edge: `EdgeRecords`, a part of `EdgeStore`
(edge_store.py), which owns the shards, their life cycle and their lock.

What a turn writes is laid out for the few fields something filters on: a message's point holds
its session (what deleting a session filters on) and the message as one JSON text; a usage
record's, its time (what sums scroll by) and the record; a session record stays field by field
(listed by time and namespace, found by labels), and a change to it is set field by field.
Edge converts a payload field by field, at several µs a field (~40 µs for a message's eleven,
measured), and a turn writes four messages, four session changes and two usage records.
Points that an earlier version wrote field by field are read as they are.

Sessions and messages are read through `TranscriptCache` (edge_cache.py: why that is sound here).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import qdrant_edge as qe

from agentmesh.memory.edge_cache import UNKNOWN, TranscriptCache
from agentmesh.memory.edge_shards import IndexedShard
from agentmesh.memory.ports import point_id

_PAYLOAD_ONLY = "none"  # Edge wants at least one vector; payload-only shards declare an unused sparse one
_PACKED = "_json"
MODEL_CALL = "model_call"  # a message-shard point's `kind`: a model call's payloads, not a message


def payload_only() -> qe.EdgeConfig:
    return qe.EdgeConfig(sparse_vectors={_PAYLOAD_ONLY: qe.EdgeSparseVectorParams()})


def _packed_message(payload: dict[str, Any]) -> dict[str, Any]:
    return {"session_id": payload["session_id"], _PACKED: json.dumps(payload, ensure_ascii=False)}


def _packed_usage(payload: dict[str, Any]) -> dict[str, Any]:
    return {"at": payload["at"], _PACKED: json.dumps(payload, ensure_ascii=False)}


def _unpacked(payload: Any) -> dict[str, Any]:
    payload = payload or {}
    packed = payload.get(_PACKED)
    return json.loads(packed) if packed is not None else dict(payload)


class EdgeRecords:
    """Sessions, messages, namespace settings and usage records; `EdgeStore` opens the shards."""

    root: Path
    _sessions: IndexedShard | None
    _messages: IndexedShard | None
    _namespaces: IndexedShard | None
    _usage: IndexedShard | None
    _cache: TranscriptCache

    @property
    def sessions(self) -> IndexedShard:
        assert self._sessions is not None, "the store is not open"
        return self._sessions

    @property
    def messages(self) -> IndexedShard:
        assert self._messages is not None, "the store is not open"
        return self._messages

    @property
    def cached_transcript_bytes(self) -> int:
        """The estimated size of what the store keeps in memory of sessions and transcripts."""
        return self._cache.size

    # ------------------------------------------------------------------ sessions

    async def get_session(self, session_id: str) -> dict[str, Any] | None:
        cached = self._cache.session(session_id)
        if cached is UNKNOWN:
            found = self.sessions.shard.retrieve([point_id("session", session_id)], True, False)
            cached = dict(found[0].payload or {}) if found else None
            self._cache.put_session(session_id, cached)
        return None if cached is None else dict(cached)

    async def put_session(self, payload: dict[str, Any]) -> None:
        session_id = payload["session_id"]
        pid = point_id("session", session_id)
        known = self._cache.session(session_id)
        if known is not UNKNOWN and known is not None and known.keys() == payload.keys():
            # Only what changed (an append: the count and the time) set on the stored record:
            # Edge takes several µs to convert each field of a payload, and a record has a dozen.
            changed = {k: v for k, v in payload.items() if known[k] != v}
            if not changed:
                return  # the shard holds this record already
            operation = qe.UpdateOperation.set_payload([pid], changed)
        else:
            operation = qe.UpdateOperation.upsert_points([qe.Point(pid, {}, payload)])
        try:
            self.sessions.update(operation)
        except BaseException:
            self._cache.forget(session_id)  # what the shard holds now is for it to say
            raise
        self._cache.put_session(session_id, dict(payload))

    async def list_sessions(self, limit: int, start_before: float | None,
                            namespaces: frozenset[str] | None = None) -> list[dict[str, Any]]:
        order = qe.OrderBy("created_at", qe.Direction.Desc, start_before)
        if namespaces is not None and not namespaces:
            return []
        selector = None if namespaces is None else qe.Filter(
            must=[qe.FieldCondition("namespace", match=qe.MatchAny(sorted(namespaces)))])
        records, _ = self.sessions.shard.scroll(
            qe.ScrollRequest(limit=limit, order_by=order, filter=selector, with_payload=True))
        return [dict(r.payload or {}) for r in records]

    async def get_namespace_settings(self, namespace: str) -> dict[str, Any] | None:
        assert self._namespaces is not None, "the store is not open"
        found = self._namespaces.shard.retrieve([point_id("namespace", namespace)], True, False)
        return dict(found[0].payload or {}) if found else None

    async def put_namespace_settings(self, payload: dict[str, Any]) -> None:
        assert self._namespaces is not None, "the store is not open"
        point = qe.Point(point_id("namespace", payload["namespace"]), {}, payload)
        self._namespaces.update(qe.UpdateOperation.upsert_points([point]))

    async def child_sessions(self, session_id: str, label: str) -> list[str]:
        selector = qe.Filter(must=[qe.FieldCondition(f"labels.{label}", match=qe.MatchValue(session_id))])
        found, offset = [], None
        while True:
            records, offset = self.sessions.shard.scroll(
                qe.ScrollRequest(offset=offset, limit=256, filter=selector, with_payload=["session_id"])
            )
            found += [(r.payload or {})["session_id"] for r in records]
            if offset is None:
                return found

    async def delete_session(self, session_id: str) -> None:
        # The record goes first: a crash in between leaves unreachable messages (a re-created
        # session starts at seq 1 and overwrites them), never a session that lost its history.
        try:
            self.sessions.update(qe.UpdateOperation.delete_points([point_id("session", session_id)]))
            selector = qe.Filter(must=[qe.FieldCondition("session_id", match=qe.MatchValue(session_id))])
            self.messages.update(qe.UpdateOperation.delete_points_by_filter(selector))
        finally:
            self._cache.forget(session_id)

    # ------------------------------------------------------------------ messages

    async def put_messages(self, session_id: str, payloads: Sequence[dict[str, Any]]) -> None:
        points = [qe.Point(point_id("message", session_id, str(p["seq"])), {}, _packed_message(p)) for p in payloads]
        try:
            self.messages.update(qe.UpdateOperation.upsert_points(points))
        except BaseException:
            self._cache.forget(session_id)
            raise
        self._cache.put_messages(session_id, payloads)

    async def append_messages(self, session_id: str, payloads: Sequence[dict[str, Any]], session: dict[str, Any]) -> None:
        await self.put_messages(session_id, payloads)
        await self.put_session(session)

    async def get_messages(self, session_id: str, seqs: Sequence[int]) -> list[dict[str, Any]]:
        """In seq order; the payloads are shared with the cache: read them, do not change them."""
        ordered = seqs if isinstance(seqs, range) and seqs.step == 1 else sorted(set(seqs))
        held, missing = self._cache.messages(session_id, ordered)
        if not missing:
            return [held[seq] for seq in ordered]
        found = {seq: held[seq] for seq in ordered if seq in held}
        ids: list[Any] = [point_id("message", session_id, str(seq)) for seq in missing]
        read = [_unpacked(r.payload) for r in self.messages.shard.retrieve(ids, True, False)]
        self._cache.put_messages(session_id, read)
        found.update((int(p["seq"]), p) for p in read)
        return [found[seq] for seq in ordered if seq in found]

    # ------------------------------------------------------------------ model calls

    async def put_model_calls(self, payloads: Sequence[dict[str, Any]]) -> None:
        # Beside the messages, unseen by them (read by point id, never scrolled), and filtered
        # on session_id like them when the session goes.
        points = [qe.Point(point_id("model_call", p["session_id"], p["id"]), {},
                           {"session_id": p["session_id"], "kind": MODEL_CALL, _PACKED: json.dumps(p, ensure_ascii=False)})
                  for p in payloads]
        if points:
            self.messages.update(qe.UpdateOperation.upsert_points(points))

    async def list_model_calls(self, session_id: str) -> list[dict[str, Any]]:
        selector = qe.Filter(must=[qe.FieldCondition("session_id", match=qe.MatchValue(session_id)),
                                   qe.FieldCondition("kind", match=qe.MatchValue(MODEL_CALL))])
        found: list[dict[str, Any]] = []
        offset = None
        while True:
            records, offset = self.messages.shard.scroll(
                qe.ScrollRequest(offset=offset, limit=256, filter=selector, with_payload=True))
            found += [_unpacked(r.payload) for r in records]
            if offset is None:
                return found

    # ------------------------------------------------------------------ usage

    def usage_shard(self, create: bool) -> IndexedShard | None:
        """Opened on first use, like a namespace's memories: a memory service that records no
        usage (tests, tools-only set-ups) carries no shard, and no threads, for it."""
        if self._usage is None:
            assert self._sessions is not None, "the store is not open"
            root = self.root / "usage"
            if not create and not root.exists():
                return None
            self._usage = IndexedShard.open_or_create(root, payload_only, 0)
            if self._usage.shard.info().payload_schema.get("at") is None:
                self._usage.update(qe.UpdateOperation.create_field_index("at", qe.PayloadSchemaType.Float))
        return self._usage

    async def put_usage(self, payloads: Sequence[dict[str, Any]]) -> None:
        points = [qe.Point(point_id("usage", p["id"]), {}, _packed_usage(p)) for p in payloads]
        shard = self.usage_shard(create=bool(points))
        if shard is not None and points:
            shard.update(qe.UpdateOperation.upsert_points(points))

    async def delete_usage(self, ids: Sequence[str]) -> None:
        shard = self.usage_shard(create=False)
        if shard is not None and ids:
            shard.update(qe.UpdateOperation.delete_points([point_id("usage", i) for i in ids]))

    async def scroll_usage(self, start: float, end: float, limit: int, offset: str | None) -> tuple[list[dict[str, Any]], str]:
        shard = self.usage_shard(create=False)
        if shard is None:
            return [], ""
        timed = qe.FieldCondition("at", range=qe.RangeFloat(gte=start or None, lt=end or None))
        records, next_offset = shard.shard.scroll(
            qe.ScrollRequest(offset=offset, limit=limit, filter=qe.Filter(must=[timed]), with_payload=True)
        )
        return [_unpacked(r.payload) for r in records], ("" if next_offset is None else str(next_offset))
