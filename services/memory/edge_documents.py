"""The document port (ports.DocumentStore) on Qdrant Edge: one payload-only shard, `documents/`,
beside the sessions and messages under `$AGENTMESH_HOME/memory/`, a point per document.

The shard belongs to the memory store (`EdgeStore.payload_shard`), so it shares the store's file
lock, its background flush and its close; writes go through the shard's write-ahead log before a
call returns, like every other write of the embedded store.
"""

from __future__ import annotations

from typing import Any

import qdrant_edge as qe

from agentmesh.memory.edge_shards import IndexedShard
from agentmesh.memory.edge_store import EdgeStore
from agentmesh.memory.ports import document_point

SHARD = "documents"
_PAGE = 256


def _where(kind: str, namespace: str) -> qe.Filter:
    return qe.Filter(must=[
        qe.FieldCondition("kind", match=qe.MatchValue(kind)),
        qe.FieldCondition("namespace", match=qe.MatchValue(namespace)),
    ])


class EdgeDocuments:
    def __init__(self, store: EdgeStore):
        self._store = store
        self._shard: IndexedShard | None = None

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
        return dict((found[0].payload or {})["body"]) if found else None

    async def put_document(self, kind: str, namespace: str, key: str, payload: dict[str, Any]) -> None:
        body = {"kind": kind, "namespace": namespace, "key": key, "body": payload}
        self.shard.update(qe.UpdateOperation.upsert_points([qe.Point(document_point(kind, namespace, key), {}, body)]))

    async def delete_document(self, kind: str, namespace: str, key: str) -> bool:
        point = document_point(kind, namespace, key)
        if not self.shard.shard.retrieve([point], False, False):
            return False
        self.shard.update(qe.UpdateOperation.delete_points([point]))
        return True

    async def list_documents(self, kind: str, namespace: str) -> list[tuple[str, dict[str, Any]]]:
        found: list[tuple[str, dict[str, Any]]] = []
        offset = None
        while True:
            records, offset = self.shard.shard.scroll(
                qe.ScrollRequest(offset=offset, limit=_PAGE, filter=_where(kind, namespace), with_payload=True)
            )
            found += [((r.payload or {})["key"], dict((r.payload or {})["body"])) for r in records]
            if offset is None:
                return sorted(found, key=lambda item: item[0])
