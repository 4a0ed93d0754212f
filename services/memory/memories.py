"""Long-term memory: remember (upsert), search (hybrid), get, list, forget, import.

Namespaces never mix: every call names one, and the store keeps them apart (a shard or
collection per namespace, or a shared one with the namespace as a filter and IDF corpus; see
edge_store.py and qdrant_store.py). Point ids derive from the namespace too, so even a known id
cannot reach across. The core talks to the store through ports.LongTermStore only.
"""

from __future__ import annotations

import asyncio
import builtins
import time
import uuid
import weakref
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Sequence

from opentelemetry import trace

from agentmesh.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from agentmesh.ids import validate_id, validate_namespace
from agentmesh.logs import get_logger
from agentmesh.memory.context import NEIGHBORS, WINDOW, Contextualised, Pending, with_neighbors
from agentmesh.memory.embedders import Embedder
from agentmesh.memory.memory_records import (
    DEFAULT_KIND,
    Hit,
    MemoryQuery,
    MemoryRecord,
    RememberItem,
    check_kind,
    check_metadata,
    content_id,
)
from agentmesh.memory.ports import VECTOR_KEY, FusionPlan, LongTermStore, PointFilter, point_id, stored_time
from agentmesh.memory.settings import MemorySettings
from agentmesh.memory.text import SparseEncoder, Tokenizer

log = get_logger("agentmesh.memory")

# Above the gateway's 100k-character message, so recall with a whole user message never fails.
MAX_QUERY_BYTES = 512 * 1024
# Embedding models read a few hundred tokens (MiniLM 256) and endpoints refuse long inputs, so
# the dense side sees the start of a long text; the sparse side indexes all of it.
DENSE_INPUT_CHARS = 8000
DEFAULT_K, MAX_K = 5, 100
DEFAULT_PAGE, MAX_PAGE = 50, 1000
WRITE_BATCH = 256


def boost_neighbors(rows: list[tuple[str, float, dict[str, Any]]], boost: float) -> list[tuple[str, float, dict[str, Any]]]:
    """Re-rank fused candidates: each gains `boost` x its best stream neighbour's score among them."""
    fused = {pid: score for pid, score, _ in rows}
    out = []
    for pid, score, payload in rows:
        neighbours = [fused.get(n, 0.0) for n in payload.get(NEIGHBORS) or () if n]
        out.append((pid, score + boost * max(neighbours, default=0.0), payload))
    out.sort(key=lambda row: -row[1])
    return out


def default_dense_weight(embedder_name: str) -> float:
    # Measured on LoCoMo (docs/memory.md): feature hashing adds little beside BM25, so it mostly
    # breaks ties; a trained model (MiniLM, an embeddings endpoint) earns about a third of BM25's say.
    return 0.1 if embedder_name.startswith("hashing") else 0.35


def date_words(timestamp: float) -> str:
    moment = datetime.fromtimestamp(timestamp, tz=UTC)
    return f"{moment.day} {moment:%B} {moment.year} {moment:%A}"



class Memories:
    def __init__(
        self, store: LongTermStore, embedder: Embedder, settings: MemorySettings, tracer: Any = None, sparse: Any = None
    ):
        self._store = store
        self._embedder = embedder
        self._settings = settings
        # Spans for the two costly steps inside an RPC (the gRPC interceptor makes the RPC's own).
        self._tracer = tracer or trace.NoOpTracer()
        # BM25 encoder: text.py's (benches/locomo.py compares others with `.document`/`.query`).
        self._sparse = sparse or SparseEncoder(Tokenizer())
        self._ready = False
        self._refusal = ""
        self._open_lock = asyncio.Lock()
        self._write_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    @property
    def embedder(self) -> Embedder:
        return self._embedder

    async def open(self) -> None:
        """Check the store against the embedder; a remote embedder that is down is retried on use."""
        try:
            await self._ensure_ready()
        except Unavailable as exc:
            log.warning("embedder not reachable yet; memory calls will retry", reason=exc.message)
        except FailedPrecondition as exc:
            log.error("long-term memory refused", reason=exc.message)

    async def ready(self) -> None:
        """Raises what keeps long-term memory from working (recall.py embeds with the same model)."""
        await self._ensure_ready()

    async def _ensure_ready(self) -> None:
        if self._ready:
            return
        if self._refusal:
            raise FailedPrecondition(self._refusal)
        async with self._open_lock:
            if self._ready:
                return
            await self._embedder.start()
            self._refusal = await self._store.check_embedder(self._embedder.name, self._embedder.dim)
            if self._refusal:
                raise FailedPrecondition(self._refusal)
            self._ready = True

    # ------------------------------------------------------------ validation

    def _validate_item(self, item: RememberItem, now: float) -> RememberItem:
        namespace = validate_namespace(item.namespace)
        text = item.text.strip()
        if not text:
            raise InvalidArgument("text is empty: a memory needs some words")
        size = len(text.encode("utf-8"))
        if size > self._settings.max_memory_bytes:
            raise InvalidArgument(
                f"text is {size} bytes; a memory holds at most {self._settings.max_memory_bytes} bytes - "
                "store a summary, or split it into several memories"
            )
        if item.id:
            validate_id(item.id, "id")
        if item.source_session_id:
            validate_id(item.source_session_id, "source_session_id")
        if item.created_at < 0 or item.created_at > now + 366 * 86400:
            raise InvalidArgument(f"created_at {item.created_at} is not a plausible unix time in seconds")
        return replace(
            item,
            namespace=namespace,
            text=text,
            kind=check_kind(item.kind or DEFAULT_KIND),
            metadata=check_metadata(item.metadata),
            id=item.id or content_id(namespace, text),
            created_at=stored_time(item.created_at),
        )

    def _point_filter(self, namespace: str, q: MemoryQuery | None) -> PointFilter:
        namespace = validate_namespace(namespace)
        q = q or MemoryQuery()
        for kind in q.kinds:
            check_kind(kind)
        metadata = check_metadata(dict(q.metadata), "metadata filter")
        for key, value in metadata.items():
            if isinstance(value, (dict, list)) or value is None:
                raise InvalidArgument(
                    f"metadata filter on {key!r} must be a string, number or boolean (exact match), "
                    f"not {type(value).__name__ if value is not None else 'null'}"
                )
        if q.created_after < 0 or q.created_before < 0:
            raise InvalidArgument("created_after and created_before are unix seconds and cannot be negative")
        if q.created_after and q.created_before and q.created_after >= q.created_before:
            raise InvalidArgument("created_after must be earlier than created_before")
        if q.source_session_id:
            validate_id(q.source_session_id, "source_session_id")
        return PointFilter(
            namespace=namespace,
            kinds=tuple(q.kinds),
            metadata=tuple(sorted(metadata.items())),
            created_after=q.created_after,
            created_before=q.created_before,
            source_session_id=q.source_session_id,
        )

    # ------------------------------------------------------------ writes

    async def _write(self, items: Sequence[RememberItem], now: float) -> list[MemoryRecord]:
        await self._ensure_ready()
        # Writes to one namespace take turns in this process: an upsert reads what it replaces
        # (created_at) and its stream neighbours, and two interleaved writers would miss each other.
        lock = self._write_locks.setdefault(items[0].namespace, asyncio.Lock())
        async with lock:
            return await self._write_locked(items, now)

    async def _write_locked(self, items: Sequence[RememberItem], now: float) -> list[MemoryRecord]:
        pids = [point_id("memory", it.namespace, it.id) for it in items]
        existing = await self._store.get_memories(items[0].namespace, pids)
        records, pending = [], []
        for pid, it in zip(pids, items, strict=True):
            before = existing.get(pid)
            record = MemoryRecord(
                id=it.id,
                namespace=it.namespace,
                text=it.text,
                kind=it.kind,
                metadata=it.metadata,
                # Remembering again refreshes a memory; it keeps the time it was first learnt.
                created_at=it.created_at or (float(before["created_at"]) if before else now),
                updated_at=now,
                source_session_id=it.source_session_id,
                # Whoever refreshes a memory, it stays the one who first made it.
                created_by=str(before.get("created_by") or "") if before else it.created_by,
            )
            records.append(record)
            pending.append(Pending(pid, vars(record).copy()))
        window = self._settings.context_window if self._settings.context_weight > 0 else 0
        given = {pid: list(it.vector) for pid, it in zip(pids, items, strict=True) if it.vector}
        rows = await self._index(await with_neighbors(self._store, pending, window, self._settings.context_kinds),
                                 given)
        await self._store.upsert_memories(items[0].namespace, rows)
        return records

    async def _index(self, items: Sequence[Contextualised],
                     given: dict[str, list[float]] | None = None) -> list[tuple[Any, ...]]:
        """Dense and sparse vectors of each memory, its neighbours' words included as configured;
        a dense vector `given` (an import's, of this embedder) is used as it is."""
        s, given = self._settings, given or {}
        dense_inputs = [
            ("\n".join([c.payload["text"], *(t for t, _ in c.context)]) if s.dense_context and c.context else c.payload["text"])[
                :DENSE_INPUT_CHARS
            ]
            for c in items if c.pid not in given
        ]
        with self._tracer.start_as_current_span(
            "memory.embed", attributes={"memory.embedder": self._embedder.name, "memory.texts": len(dense_inputs)}
        ):
            embedded = iter(await self._embedder.embed(dense_inputs) if dense_inputs else [])
        dense = [given[c.pid] if c.pid in given else next(embedded) for c in items]
        rows = []
        for c, vector in zip(items, dense, strict=True):
            # A neighbour's words count less the further it is: weight ** distance (0.5, 0.25, ...).
            extra = [(text, s.context_weight**distance) for text, distance in c.context]
            if s.index_dates:
                extra.append((date_words(c.payload["created_at"]), 1.0))
            rows.append((c.pid, vector, self._sparse.document(c.payload["text"], extra), c.payload))
        return rows

    async def remember(self, item: RememberItem) -> MemoryRecord:
        now = stored_time(time.time())
        valid = self._validate_item(item, now)
        return (await self._write([valid], now))[0]

    @property
    def embedder_id(self) -> str:
        """What the dense vectors are of, "NAME:DIM": vectors of another embedder are not used."""
        return f"{self._embedder.name}:{self._embedder.dim}"

    async def import_many(self, namespace: str, items: Sequence[RememberItem], embedder: str = "") -> int:
        namespace = validate_namespace(namespace)
        if not items:
            raise InvalidArgument("memories is empty: import at least one memory")
        await self._ensure_ready()
        if embedder != self.embedder_id:
            items = [replace(it, vector=()) for it in items]  # another model's vectors: embed the texts
        for number, it in enumerate(items, start=1):
            if it.vector and len(it.vector) != self._embedder.dim:
                raise InvalidArgument(f"memory {number}: its vector has {len(it.vector)} numbers, but {embedder} "
                                      f"makes {self._embedder.dim}; nothing was imported")
        if len(items) > self._settings.max_import:
            raise InvalidArgument(
                f"{len(items)} memories in one import; the limit is {self._settings.max_import} - send batches"
            )
        now = stored_time(time.time())
        valid: dict[str, RememberItem] = {}
        for number, item in enumerate(items, start=1):
            if item.namespace and validate_namespace(item.namespace) != namespace:
                raise InvalidArgument(
                    f"memory {number} names namespace {item.namespace!r}, but the import is into {namespace!r}"
                )
            try:
                checked = self._validate_item(replace(item, namespace=namespace), now)
            except InvalidArgument as exc:
                raise InvalidArgument(f"memory {number}: {exc.message}; nothing was imported") from None
            valid[checked.id] = checked  # the same memory twice in one batch: the last one wins
        batch = list(valid.values())
        for start in range(0, len(batch), WRITE_BATCH):
            await self._write(batch[start : start + WRITE_BATCH], now)
        return len(batch)

    # ------------------------------------------------------------ reads

    async def search(self, namespace: str, query: str, k: int, q: MemoryQuery | None = None) -> list[Hit]:
        pf = self._point_filter(namespace, q)
        query = query.strip()
        if not query:
            raise InvalidArgument("query is empty: say what to look for")
        if len(query.encode("utf-8")) > MAX_QUERY_BYTES:
            raise InvalidArgument(f"query is longer than {MAX_QUERY_BYTES} bytes; shorten it")
        if k < 0 or k > MAX_K:
            raise InvalidArgument(f"k must be between 1 and {MAX_K}, got {k}")
        k = k or DEFAULT_K
        await self._ensure_ready()
        with self._tracer.start_as_current_span(
            "memory.embed", attributes={"memory.embedder": self._embedder.name, "memory.texts": 1}
        ):
            dense = (await self._embedder.embed([query[:DENSE_INPUT_CHARS]]))[0]
        s = self._settings
        plan = FusionPlan(
            fusion=s.fusion,
            prefetch_limit=max(k * s.prefetch_factor, 20),
            rrf_k=s.rrf_k,
            dense_weight=s.dense_weight or default_dense_weight(self._embedder.name),
            sparse_weight=s.sparse_weight,
        )
        boost = s.neighbor_boost
        with self._tracer.start_as_current_span(
            "memory.hybrid_query", attributes={"memory.namespace": pf.namespace, "memory.k": k}
        ):
            rows = await self._store.hybrid_search(
                pf, dense, self._sparse.query(query), plan.prefetch_limit if boost else k, plan
            )
        if boost:
            rows = boost_neighbors(rows, boost)
        return [Hit(MemoryRecord.from_payload(p), score) for _, score, p in rows[:k]]

    async def get(self, namespace: str, memory_id: str) -> MemoryRecord:
        namespace = validate_namespace(namespace)
        validate_id(memory_id, "id")
        await self._ensure_ready()
        found = await self._store.get_memories(namespace, [point_id("memory", namespace, memory_id)])
        for payload in found.values():
            if payload.get("namespace") == namespace:
                return MemoryRecord.from_payload(payload)
        raise NotFound(f"no memory {memory_id!r} in namespace {namespace!r}")

    async def list(
        self, namespace: str, q: MemoryQuery | None, page_size: int, page_token: str
    ) -> tuple[list[MemoryRecord], str]:
        pairs, token = await self.list_with_vectors(namespace, q, page_size, page_token, vectors=False)
        return [m for m, _ in pairs], token

    async def list_with_vectors(
        self, namespace: str, q: MemoryQuery | None, page_size: int, page_token: str, vectors: bool = True
    ) -> tuple[builtins.list[tuple[MemoryRecord, builtins.list[float]]], str]:
        """A page of memories, each with its dense vector if `vectors` (for export), else []."""
        pf = self._point_filter(namespace, q)
        if page_size < 0 or page_size > MAX_PAGE:
            raise InvalidArgument(f"page_size must be between 1 and {MAX_PAGE}, got {page_size}")
        if page_token:
            try:
                uuid.UUID(page_token)
            except ValueError:
                raise InvalidArgument(
                    "page_token is not one this service issued; pass back next_page_token unchanged"
                ) from None
        await self._ensure_ready()
        rows, token = await self._store.scroll_memories(pf, page_size or DEFAULT_PAGE, page_token or None, vectors)
        return [(MemoryRecord.from_payload(p), [*(p.get(VECTOR_KEY) or ())]) for _, p in rows], token

    async def forget(
        self,
        namespace: str,
        *,
        ids: Sequence[str] = (),
        memory_filter: MemoryQuery | None = None,
        forget_all: bool = False,
    ) -> int:
        has_filter = memory_filter is not None and not memory_filter.is_empty()
        pf = self._point_filter(namespace, memory_filter if has_filter else None)
        if ids and (has_filter or forget_all):
            raise InvalidArgument("give either ids or a filter (or all=true), not both")
        if has_filter and forget_all:
            raise InvalidArgument(
                "all=true forgets the whole namespace; drop the filter, or drop all=true to forget what matches"
            )
        if not (ids or has_filter or forget_all):
            raise InvalidArgument("say what to forget: ids, a filter, or all=true for the whole namespace")
        for memory_id in ids:
            validate_id(memory_id, "id")
        await self._ensure_ready()
        async with self._write_locks.setdefault(pf.namespace, asyncio.Lock()):
            if forget_all:
                return await self._store.delete_memories_by_filter(pf)
            if ids:
                pids = [point_id("memory", pf.namespace, i) for i in dict.fromkeys(ids)]
                forgotten = await self._store.get_memories(pf.namespace, pids)
                await self._store.delete_memories_by_ids(pf.namespace, list(forgotten))
            else:
                forgotten = await self._matching(pf)
                await self._store.delete_memories_by_filter(pf)
            await self._reindex_neighbours_of(pf.namespace, forgotten)
            return len(forgotten)

    async def _matching(self, pf: PointFilter) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        token: str | None = None
        while True:
            rows, token = await self._store.scroll_memories(pf, MAX_PAGE, token)
            found.update(rows)
            if not token:
                return found

    async def _reindex_neighbours_of(self, namespace: str, forgotten: dict[str, dict[str, Any]]) -> None:
        """A forgotten memory's words must stop finding the memories that were indexed beside it:
        re-index its surviving stream neighbours with the neighbours they have now."""
        neighbour_ids = {
            n for payload in forgotten.values() for n in [*(payload.get(NEIGHBORS) or ()), *(payload.get(WINDOW) or ())] if n
        }
        survivors = await self._store.get_memories(namespace, sorted(neighbour_ids - forgotten.keys()))
        if not survivors:
            return
        window = self._settings.context_window if self._settings.context_weight > 0 else 0
        pending = [Pending(pid, dict(payload)) for pid, payload in survivors.items()]
        rows = await self._index(await with_neighbors(self._store, pending, window, self._settings.context_kinds))
        await self._store.upsert_memories(namespace, rows)
