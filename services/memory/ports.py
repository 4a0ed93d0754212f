"""The storage ports of the memory core, in plain Python types, one per thing stored: sessions
(`SessionStore`) and their messages (`MessageStore`) — together `TranscriptStore`, for
`transcripts.py` —, namespace settings (`NamespaceSettingsStore`, `namespaces.py`), long-term
memories kept (`MemoryStore`) and searched (`MemorySearch`) — together `LongTermStore`, for
`memories.py` and `context.py` —, usage records (`UsageStore`, `usage.py`); `Store` is all of
them with the life cycle (`StoreLifecycle`). The learning cores (`profiles.py`, `skills.py`,
`promoted.py`, `reflections.py`) need `DocumentStore`; named agents (`agents.py`) need `AgentStore`,
which both document adapters implement (`agent_records.AgentRecords`).

Two adapters implement it: `edge_store.EdgeStore` (Qdrant Edge, embedded under AGENTMESH_HOME, the
default) and `qdrant_store.QdrantStore` (a Qdrant server through qdrant-client). The cores import
this module only, never an adapter; `stores.open_store` picks one from the settings. The document
store has the same two adapters (`edge_documents.EdgeDocuments`, `qdrant_documents.QdrantDocuments`),
opened in the same place as the memory store by `stores.open_documents`.

Payloads are JSON-like dicts. A sparse vector is `(indices, values)`. Point ids are UUID strings
derived from our own ids (`point_id`), so the same logical record always lands on the same point:
writes are idempotent and need no read to find what they replace.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

__all__ = [
    "DENSE",
    "SPARSE",
    "VERSION",
    "AgentStore",
    "DocumentStore",
    "FusionPlan",
    "LongTermStore",
    "MemoryRow",
    "MemorySearch",
    "MemoryStore",
    "MessageStore",
    "NamespaceSettingsStore",
    "PointFilter",
    "RunStore",
    "ScoredRow",
    "SessionStore",
    "Store",
    "StoreLifecycle",
    "TranscriptStore",
    "UsageStore",
    "document_point",
    "point_id",
    "stored_time",
]

DENSE = "dense"
# scroll_memories(with_vectors=True) puts a memory's dense vector in its payload under this key.
VECTOR_KEY = "_dense"
SPARSE = "bm25"

_ID_NAMESPACE = uuid.UUID("5b0c7a4e-2f51-4f0e-9a55-6d1f0b7c2e11")

Payload = dict[str, Any]  # a record as stored: JSON-like values
SparseVector = tuple[list[int], list[float]]
# (point id, dense vector, sparse vector, payload): one memory as the core indexes it.
MemoryRow = tuple[str, list[float], SparseVector, Payload]
# (point id, score, payload): one search hit.
ScoredRow = tuple[str, float, Payload]


# uuid5's hash with the namespace already fed in: every id hashes only its own parts.
_ID_HASH = hashlib.sha1(_ID_NAMESPACE.bytes)


def point_id(*parts: str) -> str:
    """`str(uuid.uuid5(_ID_NAMESPACE, "\x1f".join(parts)))`, computed without building a UUID
    object: a turn computes dozens of these, and uuid5 spent more on the object than on the hash."""
    digest = _ID_HASH.copy()
    digest.update("\x1f".join(parts).encode())
    raw = bytearray(digest.digest()[:16])
    raw[6] = (raw[6] & 0x0F) | 0x50  # version 5
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    x = raw.hex()
    return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"


def stored_time(t: float) -> float:
    """A unix time as the cores keep it: to the microsecond. Qdrant stores payloads as JSON and
    may parse a 17-digit float back one bit off; a microsecond value (at most 16 significant
    digits before the year 2255) always reads back exactly, so a record written and the same
    record read compare equal (and page tokens built from them stay valid)."""
    return round(t, 6)


@dataclass(frozen=True)
class PointFilter:
    """Conditions on memory payloads; every memory query carries the namespace."""

    namespace: str
    kinds: tuple[str, ...] = ()
    metadata: tuple[tuple[str, Any], ...] = ()
    created_after: float = 0.0
    created_before: float = 0.0
    source_session_id: str = ""


@dataclass(frozen=True)
class FusionPlan:
    fusion: str  # "rrf" | "dbsf" | "weighted"
    prefetch_limit: int
    rrf_k: int = 60
    dense_weight: float = 1.0
    sparse_weight: float = 1.0


# The storage port, split by what is stored: each core asks for the small ports it uses, and each
# small port has a conformance suite of its own run against every adapter
# (tests/memory/test_*_port.py; tests/memory/test_storage_port.py checks the split). `Store` is
# all of them: what an adapter implements and `stores.open_store` returns.


class StoreLifecycle(Protocol):
    """Opening and closing a store."""

    where: str  # a path or URL, for messages a person reads

    async def open(self) -> None:
        """Create what is missing (collections, shards, indexes)."""

    async def close(self) -> None: ...


class SessionStore(Protocol):
    """Session records (payload dicts keyed by `session_id`), durable once a call returns."""

    async def get_session(self, session_id: str) -> Payload | None: ...
    async def put_session(self, payload: Payload) -> None: ...
    async def list_sessions(self, limit: int, start_before: float | None,
                            namespaces: frozenset[str] | None = None) -> list[Payload]:
        """Newest first, from created_at <= start_before (ties included); only sessions of
        `namespaces` when given (a caller's tenants)."""

    async def child_sessions(self, session_id: str, label: str) -> list[str]:
        """Ids of the sessions whose label `label` names `session_id`."""

    async def delete_session(self, session_id: str) -> None:
        """The record, then its messages."""


class MessageStore(Protocol):
    """Transcript messages (payload dicts keyed by `session_id`, `seq`)."""

    async def put_messages(self, session_id: str, payloads: Sequence[Payload]) -> None: ...
    async def append_messages(self, session_id: str, payloads: Sequence[Payload], session: Payload) -> None:
        """Write the messages, then the session record that makes them visible."""

    async def get_messages(self, session_id: str, seqs: Sequence[int]) -> list[Payload]:
        """Those of `seqs` that exist, in seq order. For reading: an adapter may hand out what
        it keeps in memory (the embedded one does)."""
    async def put_model_calls(self, payloads: Sequence[Payload]) -> None:
        """Model calls' payloads (model_calls.py), each with its `session_id` and `id`: kept
        with the session's messages, so deleting the session (and retention) removes them too."""
    async def list_model_calls(self, session_id: str) -> list[Payload]:
        """The session's recorded model calls, in no set order."""


class TranscriptStore(SessionStore, MessageStore, Protocol):
    """Sessions with their messages: what the transcripts core needs (a session's record makes
    its messages visible, and deleting it deletes them)."""


class NamespaceSettingsStore(Protocol):
    """A namespace's settings (payload dicts keyed by `namespace`)."""

    async def get_namespace_settings(self, namespace: str) -> Payload | None: ...
    async def put_namespace_settings(self, payload: Payload) -> None: ...


class MemoryStore(Protocol):
    """Long-term memories as records: written, read by id or filter, counted, deleted."""

    async def check_embedder(self, embedder: str, dim: int) -> str:
        """Why long-term memory cannot be used with this embedder (vectors of another model are
        stored), or '' when it can."""

    async def get_memories(self, namespace: str, ids: Sequence[str]) -> dict[str, Payload]:
        """Payloads of the namespace's points with these ids that exist, by point id."""

    async def upsert_memories(self, namespace: str, rows: Sequence[MemoryRow]) -> None: ...
    async def scroll_memories(self, f: PointFilter, limit: int, offset: str | None,
                              with_vectors: bool = False) -> tuple[list[tuple[str, Payload]], str]:
        """A page of matching memories and the next page's offset ('' at the end); with_vectors:
        each payload with its dense vector under VECTOR_KEY."""

    async def count_memories(self, f: PointFilter) -> int: ...
    async def delete_memories_by_filter(self, f: PointFilter) -> int: ...
    async def delete_memories_by_ids(self, namespace: str, ids: Sequence[str]) -> None: ...


class MemorySearch(Protocol):
    """Long-term memories found: by meaning and terms fused, by one retriever, or by time."""

    async def hybrid_search(
        self, f: PointFilter, dense: list[float], sparse: SparseVector, limit: int, plan: FusionPlan
    ) -> list[ScoredRow]: ...
    async def ranked(self, f: PointFilter, vector: Any, using: str, limit: int) -> list[ScoredRow]:
        """One retriever alone (`using` is DENSE or SPARSE); benches compare it with the fusion."""

    async def stream_window(
        self, f: PointFilter, t_min: float, t_max: float, edge: int = 2, limit: int = 10_000
    ) -> tuple[list[tuple[str, Payload]], list[tuple[str, Payload]], list[tuple[str, Payload]]]:
        """The `edge` nearest before t_min (nearest first), those in [t_min, t_max], the `edge`
        nearest after t_max."""


class LongTermStore(MemoryStore, MemorySearch, Protocol):
    """Long-term memories, kept and searched: what the memories core needs."""


class UsageStore(Protocol):
    """Usage records (payload dicts keyed by `id`, timed by `at`; usage.py)."""

    async def put_usage(self, payloads: Sequence[Payload]) -> None:
        """Upsert by `id`: a record written twice is stored once."""

    async def scroll_usage(self, start: float, end: float, limit: int, offset: str | None) -> tuple[list[Payload], str]:
        """A page of the records with start <= at < end (end 0: no bound), and the next page's
        offset ('' at the end)."""

    async def delete_usage(self, ids: Sequence[str]) -> None:
        """Remove the records with these `id`s (retention, erasure); ids not there are ignored."""


class Store(StoreLifecycle, TranscriptStore, NamespaceSettingsStore, LongTermStore, UsageStore, Protocol):
    """Every small port: sessions, transcript messages, namespace settings, long-term memories
    and usage records, durable once a call returns. What an adapter implements."""


class DocumentStore(Protocol):
    """A namespace's small keyed documents: standing instructions, skills, promoted tools,
    reflection runs. Kept apart from `Store` on purpose: they are read by key, never searched by
    meaning, so they need no vectors and no embedder.

    A document is addressed by (kind, namespace, key) and is a JSON-like dict. Writes are durable
    once a call returns; the same address always lands on the same record (a put replaces it).
    The adapters keep documents where transcripts live (embedded under AGENTMESH_HOME, or the
    Qdrant server of a cluster), never on one pod's disk alone.
    """

    async def open(self) -> None:
        """Create what is missing (the shard or collection, its indexes)."""

    async def get_document(self, kind: str, namespace: str, key: str) -> Payload | None: ...

    async def put_document(self, kind: str, namespace: str, key: str, payload: Payload) -> None: ...

    async def delete_document(self, kind: str, namespace: str, key: str) -> bool:
        """True when a document was there."""

    async def list_documents(self, kind: str, namespace: str) -> list[tuple[str, Payload]]:
        """(key, payload) of every document of this kind in the namespace, by key. The payloads
        are for reading: an adapter may hand out what it keeps in memory (the embedded one does)."""

    async def swap_document(self, kind: str, namespace: str, key: str, payload: Payload, expect: int) -> bool:
        """Compare-and-set: write `payload` with `VERSION` set to expect + 1 only when the stored
        document's `VERSION` is `expect` (0: only when there is none). True when this write
        landed; False (and nothing changed) when another got there first — across every writer
        of the store, not only this process's."""


class AgentStore(Protocol):
    """Named agents of a namespace (agents.py): each version an immutable record, and a head per
    name saying which version the name points at. Versions are never replaced: a put of a version
    that exists answers False and changes nothing, so two writers cannot both make version N.
    Payloads are JSON-like dicts; the head's `name` and a version's (`name`, `version`) key them."""

    async def put_agent_version(self, namespace: str, payload: Payload) -> bool:
        """Store version payload["version"] of agent payload["name"]; False when it exists."""

    async def get_agent_version(self, namespace: str, name: str, version: int) -> Payload | None: ...

    async def list_agent_versions(self, namespace: str, name: str) -> list[Payload]:
        """Every stored version of the agent, oldest first."""

    async def put_agent_head(self, namespace: str, payload: Payload) -> None:
        """The head of agent payload["name"] (replaced whole)."""

    async def list_agent_heads(self, namespace: str) -> list[Payload]:
        """The head of every agent of the namespace, by name."""

    async def delete_agent(self, namespace: str, name: str) -> int:
        """The head, then every version; how many versions were removed."""


class RunStore(Protocol):
    """Run records (payload dicts keyed by `run_id`, in a `namespace`, of a `session_id`, timed by
    `created_at`; runs.py). Durable once a call returns; a put replaces the record."""

    async def put_run(self, payload: Payload) -> None: ...
    async def get_run(self, run_id: str) -> Payload | None: ...
    async def list_runs(self, namespace: str, session_id: str = "") -> list[Payload]:
        """The namespace's runs (of `session_id` only, when given), newest first."""

    async def pending_webhooks(self) -> list[Payload]:
        """Every run whose `webhook_state` is "pending", of every namespace."""


VERSION = "_v"  # a swapped document's version, in its payload (swap_document)


def document_point(kind: str, namespace: str, key: str) -> str:
    """The point id of a document: one address, one point, in every adapter."""
    return point_id("document", kind, namespace, key)
