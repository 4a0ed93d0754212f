"""The document port (ports.DocumentStore) on Qdrant Edge: one payload-only shard, `documents/`,
beside the sessions and messages under `$AGENTMESH_HOME/memory/`, a point per document.

The shard belongs to the memory store (`EdgeStore.payload_shard`), so it shares the store's file
lock, its background flush and its close; writes go through the shard's write-ahead log before a
call returns, like every other write of the embedded store.

A document's body is stored as one JSON text (`_json`, as the transcripts' messages are,
edge_records.py), beside the `kind`, `namespace` and `key` the listings filter on: Edge converts
and writes a payload field by field, and a run record written as a nested payload cost twice as
much CPU as the same record as one string — the gateways write one per turn, the conversation
index a watermark per session it indexes. A document stored before (its body a nested `body`)
is read as it was; it is packed when next written.

A namespace's listings (`list_documents`: its profile, its skills, its promoted tools) are kept in
memory once read: every turn's start reads three of them, and a filtered scroll with its payloads
decoded costs far more than a lookup. Sound for the same reason as the transcript cache
(edge_cache.py): the shard is this process's alone and every write to it is made here, which
drops the listing of the (kind, namespace) it writes to *after* Edge has the write (one
`EdgeDocuments` per store, as `stores.open_documents` makes it: a second one on the same shard
would not see the first one's writes in its listings). The server
adapter (qdrant_documents.py) keeps no such cache: other memory services write to the same
collection.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

import qdrant_edge as qe

from agentmesh.memory.agent_records import AgentRecords
from agentmesh.memory.edge_shards import IndexedShard
from agentmesh.memory.edge_store import EdgeStore
from agentmesh.memory.ports import VERSION, document_point

SHARD = "documents"
_PACKED = "_json"  # the body as JSON text; documents stored before it have a nested "body"
_PAGE = 256
# Listings kept, least recently read dropped first; a listing bigger than this is not kept (a
# namespace's skills with all their versions' files can be large, and are read only on change).
CACHED_LISTINGS = 256
CACHED_LISTING_BYTES = 256 * 1024


def _where(kind: str, namespace: str) -> qe.Filter:
    return qe.Filter(must=[
        qe.FieldCondition("kind", match=qe.MatchValue(kind)),
        qe.FieldCondition("namespace", match=qe.MatchValue(namespace)),
    ])


class EdgeDocuments(AgentRecords):
    def __init__(self, store: EdgeStore):
        self._store = store
        self._shard: IndexedShard | None = None
        # (kind, namespace) -> its documents, as list_documents returns them
        self._listings: OrderedDict[tuple[str, str], list[tuple[str, dict[str, Any]]]] = OrderedDict()

    @property
    def shard(self) -> IndexedShard:
        assert self._shard is not None, "the document store is not open"
        return self._shard

    async def open(self) -> None:
        self._shard = self._store.payload_shard(SHARD)
        schema = self._shard.shard.info().payload_schema
        for field in ("kind", "namespace"):
            if schema.get(field) is None:
                self._shard.update(qe.UpdateOperation.create_field_index(field, qe.PayloadSchemaType.Keyword))

    async def get_document(self, kind: str, namespace: str, key: str) -> dict[str, Any] | None:
        found = self.shard.shard.retrieve([document_point(kind, namespace, key)], True, False)
        return _body(found[0].payload) if found else None

    async def put_document(self, kind: str, namespace: str, key: str, payload: dict[str, Any]) -> None:
        body = {"kind": kind, "namespace": namespace, "key": key, _PACKED: json.dumps(payload, ensure_ascii=False)}
        try:
            self.shard.update(qe.UpdateOperation.upsert_points([qe.Point(document_point(kind, namespace, key), {}, body)]))
        finally:
            self._listings.pop((kind, namespace), None)

    async def swap_document(self, kind: str, namespace: str, key: str, payload: dict[str, Any], expect: int) -> bool:
        # Atomic without a lock: the shard is this process's alone, and nothing below awaits
        # between the read and the write.
        found = self.shard.shard.retrieve([document_point(kind, namespace, key)], True, False)
        current = int(_body(found[0].payload).get(VERSION, 0)) if found else 0
        if current != expect:
            return False
        await self.put_document(kind, namespace, key, {**payload, VERSION: expect + 1})
        return True

    async def delete_document(self, kind: str, namespace: str, key: str) -> bool:
        point = document_point(kind, namespace, key)
        if not self.shard.shard.retrieve([point], False, False):
            return False
        try:
            self.shard.update(qe.UpdateOperation.delete_points([point]))
        finally:
            self._listings.pop((kind, namespace), None)
        return True

    async def list_documents(self, kind: str, namespace: str) -> list[tuple[str, dict[str, Any]]]:
        """By key. The bodies are shared with the cache: read them, do not change them."""
        cached = self._listings.get((kind, namespace))
        if cached is not None:
            self._listings.move_to_end((kind, namespace))
            return list(cached)
        found: list[tuple[str, dict[str, Any]]] = []
        offset = None
        while True:
            records, offset = self.shard.shard.scroll(
                qe.ScrollRequest(offset=offset, limit=_PAGE, filter=_where(kind, namespace), with_payload=True)
            )
            found += [((r.payload or {})["key"], _body(r.payload)) for r in records]
            if offset is None:
                break
        found.sort(key=lambda item: item[0])
        if _size(found) <= CACHED_LISTING_BYTES:
            self._listings[(kind, namespace)] = found
            while len(self._listings) > CACHED_LISTINGS:
                self._listings.popitem(last=False)
        return list(found)


def _body(payload: Any) -> dict[str, Any]:
    """A stored point's document body: its JSON text, or the nested body of one stored before."""
    payload = payload or {}
    packed = payload.get(_PACKED)
    return json.loads(packed) if packed is not None else dict(payload["body"])


def _size(documents: list[tuple[str, dict[str, Any]]]) -> int:
    """Roughly what a listing holds, in bytes: its texts and a few hundred bytes a value."""
    def of(value: Any) -> int:
        if isinstance(value, str):
            return 60 + len(value)
        if isinstance(value, dict):
            return 200 + sum(60 + len(k) + of(v) for k, v in value.items())
        if isinstance(value, (list, tuple)):
            return 60 + sum(of(v) for v in value)
        return 30
    return sum(of(key) + of(body) for key, body in documents)
