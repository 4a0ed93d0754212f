"""The storage port for a namespace's small keyed documents: standing instructions today, skills
and promoted tools next. Kept apart from the memory store's port on purpose: these are records
read by key, never searched by meaning, so they need no vectors and no embedder.

A document is addressed by (kind, namespace, key) and is a JSON-like dict. Writes are durable
once a call returns; the same address always lands on the same record (a put replaces).
`qdrant_documents.QdrantDocuments` implements it in the Qdrant store the memory service already
uses (embedded, or a server in a cluster), so documents live where transcripts live — never on
one pod's disk alone.
"""

from __future__ import annotations

from typing import Any, Protocol


class DocumentStore(Protocol):
    async def open(self) -> None:
        """Create what is missing (the collection, its indexes)."""

    async def get_document(self, kind: str, namespace: str, key: str) -> dict[str, Any] | None: ...

    async def put_document(self, kind: str, namespace: str, key: str, payload: dict[str, Any]) -> None: ...

    async def delete_document(self, kind: str, namespace: str, key: str) -> bool:
        """True when a document was there."""

    async def list_documents(self, kind: str, namespace: str) -> list[tuple[str, dict[str, Any]]]:
        """(key, payload) of every document of this kind in the namespace, by key."""
