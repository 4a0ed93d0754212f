"""`DocumentStore` (documents.py) in Qdrant: one vectorless collection, a point per document.

Shares the memory service's Qdrant client and executor (the embedded store allows one client per
directory, and is not thread-safe), reached through the `run` callable the store hands over.
"""

from __future__ import annotations

import uuid
from typing import Any, Awaitable, Callable

from qdrant_client import QdrantClient
from qdrant_client import models as qm

DOCUMENTS = "agentmesh_documents"
_ID_NAMESPACE = uuid.UUID("0f6b2d1e-8a3c-4c57-9d0e-3b1a7e5c9f24")
_PAGE = 256

Run = Callable[..., Awaitable[Any]]


def document_point(kind: str, namespace: str, key: str) -> str:
    return str(uuid.uuid5(_ID_NAMESPACE, "\x1f".join((kind, namespace, key))))


def _where(kind: str, namespace: str) -> qm.Filter:
    return qm.Filter(must=[
        qm.FieldCondition(key="kind", match=qm.MatchValue(value=kind)),
        qm.FieldCondition(key="namespace", match=qm.MatchValue(value=namespace)),
    ])


class QdrantDocuments:
    def __init__(self, client: QdrantClient, run: Run, *, local: bool):
        self._client = client
        self._run = run
        self._local = local

    async def open(self) -> None:
        if await self._run(self._client.collection_exists, DOCUMENTS):
            return
        await self._run(self._client.create_collection, DOCUMENTS, vectors_config={})
        if not self._local:  # the embedded store has no payload indexes
            for name in ("kind", "namespace"):
                await self._run(self._client.create_payload_index, DOCUMENTS, name,
                                field_schema=qm.PayloadSchemaType.KEYWORD)

    async def get_document(self, kind: str, namespace: str, key: str) -> dict | None:
        points = await self._run(self._client.retrieve, DOCUMENTS, [document_point(kind, namespace, key)],
                                 with_payload=True)
        return dict(points[0].payload["body"]) if points else None

    async def put_document(self, kind: str, namespace: str, key: str, payload: dict) -> None:
        point = qm.PointStruct(id=document_point(kind, namespace, key), vector={},
                               payload={"kind": kind, "namespace": namespace, "key": key, "body": payload})
        await self._run(self._client.upsert, DOCUMENTS, [point], wait=True)

    async def delete_document(self, kind: str, namespace: str, key: str) -> bool:
        point = document_point(kind, namespace, key)
        if not await self._run(self._client.retrieve, DOCUMENTS, [point]):
            return False
        await self._run(self._client.delete, DOCUMENTS, qm.PointIdsList(points=[point]), wait=True)
        return True

    async def list_documents(self, kind: str, namespace: str) -> list[tuple[str, dict]]:
        found: list[tuple[str, dict]] = []
        offset = None
        while True:
            points, offset = await self._run(self._client.scroll, DOCUMENTS, scroll_filter=_where(kind, namespace),
                                             limit=_PAGE, offset=offset, with_payload=True)
            found.extend((p.payload["key"], dict(p.payload["body"])) for p in points)
            if offset is None:
                return sorted(found, key=lambda item: item[0])
