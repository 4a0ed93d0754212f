"""The document port (ports.DocumentStore) on a Qdrant server: one vectorless collection,
`agentmesh_documents`, a point per document.

Shares the memory store's client and executor (`QdrantStore.shared`), reached through the `run`
callable the store hands over: in qdrant-client's local mode (the conformance tests) one client
per directory is allowed and it is not thread-safe, so its calls must go through the same worker.
"""

from __future__ import annotations

import uuid
from typing import Any, Awaitable, Callable

from qdrant_client import QdrantClient
from qdrant_client import models as qm

from agentmesh.memory.agent_records import AgentRecords
from agentmesh.memory.ports import VERSION, document_point
from agentmesh.memory.qdrant_store import QdrantStore

DOCUMENTS = "agentmesh_documents"
_PAGE = 256

Run = Callable[..., Awaitable[Any]]


def _where(kind: str, namespace: str) -> qm.Filter:
    return qm.Filter(must=[
        qm.FieldCondition(key="kind", match=qm.MatchValue(value=kind)),
        qm.FieldCondition(key="namespace", match=qm.MatchValue(value=namespace)),
    ])


class QdrantDocuments(AgentRecords):
    def __init__(self, client: QdrantClient, run: Run, *, local: bool):
        self._client = client
        self._run = run
        self._local = local

    @classmethod
    def beside(cls, store: QdrantStore) -> "QdrantDocuments":
        client, run = store.shared()
        return cls(client, run, local=store.local)

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

    async def swap_document(self, kind: str, namespace: str, key: str, payload: dict, expect: int) -> bool:
        """Qdrant's conditional upsert: an existing point is replaced only when its version
        matches (`update_filter`), a missing one is inserted; the write then reads back its own
        token to learn whether it landed — the server orders concurrent writers, whichever
        memory replica sent them."""
        point_id = document_point(kind, namespace, key)
        token = uuid.uuid4().hex
        body = {**payload, VERSION: expect + 1, "_w": token}
        point = qm.PointStruct(id=point_id, vector={},
                               payload={"kind": kind, "namespace": namespace, "key": key, "body": body})
        matching = qm.Filter(must=[qm.FieldCondition(key=f"body.{VERSION}", match=qm.MatchValue(value=expect))])
        # expect 0 and not there: inserted; there, its version is at least 1 and the filter spares it.
        if expect and not await self._run(self._client.retrieve, DOCUMENTS, [point_id]):
            return False  # deleted meanwhile: a conditional upsert would insert it again
        await self._run(self._client.upsert, DOCUMENTS, [point], update_filter=matching, wait=True)
        points = await self._run(self._client.retrieve, DOCUMENTS, [point_id], with_payload=True)
        return bool(points) and points[0].payload["body"].get("_w") == token

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
