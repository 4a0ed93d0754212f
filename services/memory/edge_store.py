"""The storage port (ports.py) on Qdrant Edge: Qdrant's engine embedded in the memory service.

Layout under `$AGENTMESH_HOME/memory/`:

    LOCK                      held by the one memory service using this home
    sessions/  messages/      payload-only shards (session records; transcript messages)
    usage/                    payload-only shard: one record per model call (usage.py)
    namespaces/               payload-only shard: namespace settings
                              (these four are read and written by edge_records.py)
    documents/                payload-only shard of the learning documents (edge_documents.py)
    memories/<namespace>/     a namespace's memories: CURRENT + gen-NNNN/ (edge_shards.py),
                              meta.json names the embedder that filled it; past
                              AGENTMESH_MEMORY_PART_SIZE memories, more parts beside them in
                              part-NNNN/, each a shard of its own (edge_parts.py)

A shard per namespace rather than one shard with a tenant-indexed `namespace` field (measured in
benches/memory_scale.py, docs/memory.md): a namespace's search, IDF, index build and `Forget
all` touch its own points only, and a namespace's size alone decides when it gets HNSW.
`AGENTMESH_MEMORY_LAYOUT=shared` keeps them in one shard (`memories/@shared/`, `@` never appears
in an escaped name), with the namespace as a filter and as the IDF corpus.

Durability: every write goes through the shard's write-ahead log before the call returns, and
the WAL survives `kill -9` of the process without a flush (tests/memory/test_crash_safety.py).
Shards are flushed in the background, so restarts replay little. A power cut can still lose
what the OS had not written out: Edge does not fsync the WAL per write.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
import weakref
from pathlib import Path
from typing import Any, Sequence

import qdrant_edge as qe
from filelock import FileLock, Timeout

from agentmesh.errors import FailedPrecondition
from agentmesh.logs import get_logger
from agentmesh.memory.edge_cache import TranscriptCache
from agentmesh.memory.edge_parts import PartedNamespace, best_of, fuse, in_id_order
from agentmesh.memory.edge_records import EdgeRecords, payload_only
from agentmesh.memory.edge_shards import IndexedShard
from agentmesh.memory.heap import fix_mmap_threshold
from agentmesh.memory.ports import DENSE, SPARSE, VECTOR_KEY, FusionPlan, MemoryRow, PointFilter, ScoredRow

log = get_logger("agentmesh.memory.edge")

SHARED = "@shared"
META = "meta.json"
# A dirty shard is flushed about this long after its last flush. A flush costs ~5 ms of CPU per
# shard whatever it writes (it syncs every file of the shard), and a turn dirties five or six
# shards (sessions, messages, usage, the documents' run records and watermarks, the conversation
# index): at 5 s that was a millisecond of a turn's CPU at ten turns a second, for nothing the WAL
# does not already keep. What it bounds is how much a restart replays.
FLUSH_EVERY_S = 30.0
# Edge's flush holds the GIL while it syncs a shard's files (msync, fsync: 40-200 ms each on a busy
# disk), so the event loop stops for it on whatever thread it runs. One shard a tick: a call then
# waits behind one shard's flush at most, not behind every dirty shard's in a row.
FLUSH_TICK_S = 1.0
SEGMENT_POINTS = 50_000  # vectors per indexed segment, at most
# Sessions and transcripts kept in memory (edge_cache.py), by estimated size: a few thousand
# messages, the recent conversations' whole transcripts.
TRANSCRIPT_CACHE_BYTES = 8 * 1024 * 1024


# qdrant-edge-py 0.9 turns a Python bool in MatchValue into an integer, which never matches a
# stored true/false. Memories therefore carry their boolean metadata a second time as keywords
# ("key=true") in this field, which the adapter adds on write, filters on, and strips on read.
_BOOLS = "_metadata_bools"


def _match(key: str, value: Any) -> qe.FieldCondition:
    if isinstance(value, bool) and key.startswith("metadata."):
        return qe.FieldCondition(_BOOLS, match=qe.MatchValue(f"{key[len('metadata.'):]}={str(value).lower()}"))
    if isinstance(value, float):
        # MatchValue takes strings, integers and booleans; a fractional number matches as a point range.
        return qe.FieldCondition(key, range=qe.RangeFloat(gte=value, lte=value))
    return qe.FieldCondition(key, match=qe.MatchValue(value))


def _conditions(f: PointFilter, with_namespace: bool) -> list:
    must: list = [_match("namespace", f.namespace)] if with_namespace else []
    if f.kinds:
        must.append(qe.FieldCondition("kind", match=qe.MatchAny(list(f.kinds))))
    for key, value in f.metadata:
        must.append(_match(f"metadata.{key}", value))
    if f.created_after or f.created_before:
        must.append(
            qe.FieldCondition("created_at", range=qe.RangeFloat(gte=f.created_after or None, lt=f.created_before or None))
        )
    if f.source_session_id:
        must.append(_match("source_session_id", f.source_session_id))
    return must


@functools.lru_cache(maxsize=4096)
def _escape(namespace: str) -> str:
    # Remembered: every write and search of a namespace's memories names its shard (a turn's
    # recall, the conversation index's writes), and the escape walks the name a character at a time.
    return "".join(c if c.isalnum() or c == "-" else f"_{ord(c):02x}" for c in namespace)


def _with_bools(payload: dict) -> dict:
    metadata = payload.get("metadata") or {}
    bools = [f"{k}={str(v).lower()}" for k, v in metadata.items() if isinstance(v, bool)]
    return {**payload, _BOOLS: bools} if bools else payload


def _plain(payload: Any) -> dict:
    out = dict(payload or {})
    out.pop(_BOOLS, None)
    return out


def _rows(records, with_vectors: bool = False) -> list[tuple[str, dict]]:
    if not with_vectors:
        return [(str(r.id), _plain(r.payload)) for r in records]
    return [(str(r.id), {**_plain(r.payload), VECTOR_KEY: _dense_of(r.vector)}) for r in records]


def _dense_of(vector: Any) -> list[float]:
    found = vector.get(DENSE) if isinstance(vector, dict) else vector
    return [float(x) for x in found or ()]


class EdgeStore(EdgeRecords):
    def __init__(self, home: Path, *, layout: str = "auto", index_after: int = 20_000, part_size: int = 0,
                 transcript_cache_bytes: int = TRANSCRIPT_CACHE_BYTES):
        self.root = Path(home) / "memory"
        self.where = str(self.root)
        self.layout = "shared" if layout == "shared" else "per-namespace"
        self.index_after = index_after
        self.part_size = part_size  # memories in a namespace's part (edge_parts.py); 0: one part
        # Memory shards' index builds take turns: each needs its shard's size in free disk.
        self._build_slot = asyncio.Semaphore(1)
        self._lock = FileLock(str(self.root / "LOCK"))
        self._sessions: IndexedShard | None = None
        self._messages: IndexedShard | None = None
        self._usage: IndexedShard | None = None
        self._namespaces: IndexedShard | None = None  # namespace settings, one point each
        self._memories: dict[str, PartedNamespace] = {}  # open namespaces' parts by directory name
        self._payload_shards: dict[str, IndexedShard] = {}  # other adapters' shards (payload_shard)
        self._known: set[str] = set()  # memory shard directories on disk
        self._embedder: tuple[str, int] = ("", 0)
        self._flusher: asyncio.Task | None = None
        # Sessions and messages as the shards hold them; every write to those shards is made
        # here and goes through it (edge_cache.py: why that is sound in this adapter only).
        self._cache = TranscriptCache(transcript_cache_bytes)

    # ------------------------------------------------------------------ life cycle

    async def open(self) -> None:
        fix_mmap_threshold()  # heap.py: why
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            raise FailedPrecondition(
                f"the embedded memory store at {self.root} is in use by another process; stop it, "
                "or point AGENTMESH_QDRANT_URL at a Qdrant server to share memory between processes"
            ) from None
        try:
            self._sessions = IndexedShard.open_or_create(self.root / "sessions", payload_only, 0)
            self._messages = IndexedShard.open_or_create(self.root / "messages", payload_only, 0)
            self._namespaces = IndexedShard.open_or_create(self.root / "namespaces", payload_only, 0)
            if self._sessions.shard.info().payload_schema.get("created_at") is None:
                self._sessions.update(qe.UpdateOperation.create_field_index("created_at", qe.PayloadSchemaType.Float))
            if self._messages.shard.info().payload_schema.get("session_id") is None:
                self._messages.update(
                    qe.UpdateOperation.create_field_index("session_id", qe.KeywordIndexParams(is_tenant=True))
                )
            (self.root / "memories").mkdir(exist_ok=True)
            self._known = {p.name for p in (self.root / "memories").iterdir() if (p / META).exists()}
        except BaseException:
            self._lock.release()
            raise
        self._flusher = asyncio.create_task(self._flush_periodically())

    async def _flush_periodically(self) -> None:
        # Not for durability (the WAL has every write): so that a restart replays seconds, not days.
        flushed: weakref.WeakKeyDictionary[IndexedShard, float] = weakref.WeakKeyDictionary()
        while True:
            await asyncio.sleep(FLUSH_TICK_S)
            now = time.monotonic()
            due = [s for s in self._all_open() if s.dirty and now - flushed.get(s, 0.0) >= FLUSH_EVERY_S]
            if not due:
                continue
            shard = min(due, key=lambda s: flushed.get(s, 0.0))  # the longest unflushed first
            flushed[shard] = now
            try:
                await shard.flush()
            except Exception as exc:  # noqa: BLE001 - the WAL has every write; the next tick retries
                log.warning("memory shard flush failed", shard=shard.root.name, reason=str(exc))

    def _all_open(self) -> list[IndexedShard]:
        parts = [part for namespace in self._memories.values() for part in namespace.parts]
        shards = (self._sessions, self._messages, self._namespaces, self._usage, *self._payload_shards.values(),
                  *parts)
        return [s for s in shards if s is not None]

    def payload_shard(self, name: str) -> IndexedShard:
        """A payload-only shard `name` beside the sessions and messages, for an adapter of another
        port on the same home (edge_documents.py). Opened once, under this store's lock, and
        flushed and closed with the store's own shards."""
        assert self._sessions is not None, "the store is not open"
        shard = self._payload_shards.get(name)
        if shard is None:
            shard = IndexedShard.open_or_create(self.root / name, payload_only, 0)
            self._payload_shards[name] = shard
        return shard

    async def flush(self) -> None:
        for shard in self._all_open():
            await shard.flush()

    async def close(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            self._flusher = None
        for namespace in self._memories.values():
            await namespace.close()  # the newest part first: an older part's build may be waiting its turn
        self._memories.clear()
        for shard in self._all_open():
            await shard.close()
        self._payload_shards.clear()
        self._sessions = self._messages = self._namespaces = self._usage = None
        if self._lock.is_locked:
            self._lock.release()

    async def check_embedder(self, embedder: str, dim: int) -> str:
        self._embedder = (embedder, dim)
        for name in sorted(self._known):
            meta = json.loads((self.root / "memories" / name / META).read_text())
            if meta.get("dim") != dim or meta.get("embedder") != embedder:
                return (
                    f"long-term memory in {self.where} was embedded with {meta.get('embedder', 'unknown')} "
                    f"({meta.get('dim')} dimensions) but the service is configured with {embedder} ({dim} "
                    "dimensions); set AGENTMESH_EMBEDDER (and AGENTMESH_EMBEDDINGS_MODEL) back, or move the "
                    "old store away to start a new one"
                )
        return ""

    # ------------------------------------------------------------------ memory shards

    def _shard_name(self, namespace: str) -> str:
        return SHARED if self.layout == "shared" else _escape(namespace)

    def _memory_config(self) -> qe.EdgeConfig:
        _, dim = self._embedder
        # Bounded memory: an indexed segment's vectors, payloads and id tracker stay in their
        # files, mmap'd without being read in (Cold); Edge's default loads the vectors into the
        # heap (~2 KB a memory at 512 dimensions: 2 GB at 1M). The HNSW graph and the sparse
        # index stay in RAM (a small fraction of that) because every search walks them.
        return qe.EdgeConfig(
            vectors={DENSE: qe.EdgeVectorParams(size=dim, distance=qe.Distance.Cosine, memory=qe.Memory.Cold)},
            sparse_vectors={SPARSE: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)},
            payload_memory=qe.Memory.Cold,
            id_tracker_memory=qe.Memory.Cold,
            # One indexing thread: the build runs beside the service on the same few cores.
            hnsw_config=qe.HnswIndexConfig(m=16, ef_construct=100, full_scan_threshold=10_000, max_indexing_threads=1),
            # Bounded segments: a build indexes what arrived since the last one instead of
            # merging everything into one segment and re-indexing it all (minutes at 100k).
            optimizers=qe.EdgeOptimizersConfig(max_segment_size=max(1, dim * 4 * SEGMENT_POINTS // 1024)),
        )

    def _prepare_part(self, root: Path) -> IndexedShard:
        """A new part of a memory shard set, with the payload indexes the filters use."""
        part = IndexedShard.open_or_create(root, self._memory_config, self.index_after, reconfigure=True,
                                           build_slot=self._build_slot)
        for field, schema in (
            ("namespace", qe.KeywordIndexParams(is_tenant=True)),
            ("kind", qe.PayloadSchemaType.Keyword),
            ("source_session_id", qe.PayloadSchemaType.Keyword),
            ("created_at", qe.PayloadSchemaType.Float),
            (_BOOLS, qe.PayloadSchemaType.Keyword),
        ):
            part.update(qe.UpdateOperation.create_field_index(field, schema))
        return part

    def _open_part(self, root: Path) -> IndexedShard:
        return IndexedShard.open_or_create(root, self._memory_config, self.index_after, reconfigure=True,
                                           build_slot=self._build_slot)

    def _memory_shard(self, namespace: str, create: bool) -> PartedNamespace | None:
        name = self._shard_name(namespace)
        parts = self._memories.get(name)
        if parts is not None:
            return parts
        if name not in self._known and not create:
            return None
        root = self.root / "memories" / name
        fresh = name not in self._known
        parts = PartedNamespace.open(root, self.part_size, self._prepare_part if fresh else self._open_part,
                                     self._prepare_part)
        if fresh:
            embedder, dim = self._embedder
            meta = {"embedder": embedder, "dim": dim, "namespace": "" if name == SHARED else namespace}
            (root / META).write_text(json.dumps(meta))
            self._known.add(name)
        self._memories[name] = parts
        # A shard that a bulk import or a migration left unindexed (written with builds off, or
        # by a service stopped mid-way) gets its build on first use, not at its next write:
        # searches would brute-force it until then.
        parts.maybe_index()
        return parts

    def _filter(self, f: PointFilter) -> qe.Filter | None:
        must = _conditions(f, with_namespace=self.layout == "shared")
        return qe.Filter(must=must) if must else None

    def _idf(self, f: PointFilter) -> qe.SearchParams | None:
        # One shard for all namespaces: IDF over the namespace's own memories, so one tenant's
        # vocabulary never shifts another's ranking (a shard per namespace has that built in).
        if self.layout == "shared":
            return qe.SearchParams(idf=qe.IdfParams(corpus=qe.Filter(must=[_match("namespace", f.namespace)])))
        return None

    async def wait_indexed(self) -> None:
        """Until no index build is running or waiting its turn (benches and tests)."""
        while True:
            parts = [part for namespace in list(self._memories.values()) for part in namespace.parts if part.indexing]
            if not parts:
                return
            for part in parts:
                await part.wait_indexed()

    def memory_shard_stats(self, namespace: str) -> dict[str, Any]:
        parts = self._memory_shard(namespace, create=False)
        if parts is None:
            return {}
        infos = [part.shard.info() for part in parts.parts]
        return {"points": sum(i.points_count for i in infos), "segments": sum(i.segments_count for i in infos),
                "builds": sum(part.builds for part in parts.parts),
                "indexing": any(part.indexing for part in parts.parts), "parts": len(parts.parts),
                "part_points": [i.points_count for i in infos]}

    # ------------------------------------------------------------------ memories

    async def get_memories(self, namespace: str, ids: Sequence[str]) -> dict[str, dict]:
        parts = self._memory_shard(namespace, create=False)
        if not ids or parts is None:
            return {}
        found = _rows(parts.retrieve(ids))
        return {pid: p for pid, p in found if p.get("namespace") == namespace}

    async def upsert_memories(self, namespace: str, rows: Sequence[MemoryRow]) -> None:
        parts = self._memory_shard(namespace, create=True)
        assert parts is not None
        points = {
            pid: qe.Point(pid, {DENSE: dense, SPARSE: qe.SparseVector(sparse[0], sparse[1])}, _with_bools(payload))
            for pid, dense, sparse, payload in rows
        }
        async with parts.write_lock:  # where a memory goes is decided and written in one go
            await parts.open_part.admit()  # a bulk import waits for index builds that fall behind it
            parts.ensure_room()
            for part, ids in parts.holders(list(points)):
                async with part.write_lock:
                    part.update(qe.UpdateOperation.upsert_points([points[i] for i in ids]), touched=ids)
                part.maybe_index()

    async def hybrid_search(
        self, f: PointFilter, dense: list[float], sparse: tuple[list[int], list[float]], limit: int, plan: FusionPlan
    ) -> list[ScoredRow]:
        parts = self._memory_shard(f.namespace, create=False)
        if parts is None:
            return []
        qfilter = self._filter(f)
        dense_query = qe.Query.Nearest(dense, using=DENSE)
        sparse_query = qe.Query.Nearest(qe.SparseVector(sparse[0], sparse[1]), using=SPARSE) if sparse[0] else None
        if len(parts.parts) > 1:
            # Each part's candidates of each retriever, the best of them across parts, fused here:
            # what a Qdrant server does with a collection of several shards (docs/memory.md).
            lists = [best_of(parts.query(lambda: qe.QueryRequest(
                plan.prefetch_limit, query=dense_query, filter=qfilter, with_payload=False)), plan.prefetch_limit)]
            if sparse_query is not None:
                lists.append(best_of(parts.query(lambda: qe.QueryRequest(
                    plan.prefetch_limit, query=sparse_query, filter=qfilter, params=self._idf(f), with_payload=False)),
                    plan.prefetch_limit))
            fused = parts.with_payloads(fuse(lists, plan, limit))
            return [(pid, score, _plain(payload)) for pid, score, payload in fused]
        prefetch = [qe.Prefetch(plan.prefetch_limit, query=dense_query, filter=qfilter)]
        if sparse_query is not None:
            prefetch.append(qe.Prefetch(plan.prefetch_limit, query=sparse_query, filter=qfilter, params=self._idf(f)))
        if plan.fusion == "dbsf":
            fusion: Any = qe.Fusion.Dbsf()
        else:
            weights = [plan.dense_weight, plan.sparse_weight][: len(prefetch)] if plan.fusion == "weighted" else None
            fusion = qe.Fusion.Rrf(plan.rrf_k, weights)
        points = parts.open_part.shard.query(qe.QueryRequest(limit, prefetches=prefetch, query=fusion, with_payload=True))
        return [(str(p.id), float(p.score), _plain(p.payload)) for p in points]

    async def ranked(self, f: PointFilter, vector: Any, using: str, limit: int) -> list[ScoredRow]:
        parts = self._memory_shard(f.namespace, create=False)
        if parts is None:
            return []
        if isinstance(vector, tuple):
            vector = qe.SparseVector(vector[0], vector[1])
        params = self._idf(f) if using == SPARSE else None
        found = best_of(parts.query(lambda: qe.QueryRequest(
            limit, query=qe.Query.Nearest(vector, using=using), filter=self._filter(f), params=params, with_payload=True
        )), limit)
        return [(pid, score, _plain(payload)) for pid, score, payload in found]

    async def scroll_memories(self, f: PointFilter, limit: int, offset: str | None,
                              with_vectors: bool = False) -> tuple[list[tuple[str, dict]], str]:
        parts = self._memory_shard(f.namespace, create=False)
        if parts is None:
            return [], ""
        vectors: Any = [DENSE] if with_vectors else None
        if len(parts.parts) == 1:
            records, next_offset = parts.open_part.shard.scroll(
                qe.ScrollRequest(offset=offset, limit=limit, filter=self._filter(f), with_payload=True,
                                 with_vector=vectors)
            )
            return _rows(records, with_vectors), ("" if next_offset is None else str(next_offset))
        # One more than a page from each part: the parts' pages merged in id order hold the
        # namespace's page and the id that starts the next one.
        pages = [
            _rows(part.shard.scroll(
                qe.ScrollRequest(offset=offset, limit=limit + 1, filter=self._filter(f), with_payload=True,
                                 with_vector=vectors))[0], with_vectors)
            for part in parts.parts
        ]
        return in_id_order(pages, limit)

    async def stream_window(
        self, f: PointFilter, t_min: float, t_max: float, edge: int = 2, limit: int = 10_000
    ) -> tuple[list[tuple[str, dict]], list[tuple[str, dict]], list[tuple[str, dict]]]:
        parts = self._memory_shard(f.namespace, create=False)
        if parts is None:
            return [], [], []
        must = _conditions(f, with_namespace=self.layout == "shared")

        def scroll(rng: qe.RangeFloat, direction: Any, n: int) -> list[tuple[str, dict]]:
            cond = qe.FieldCondition("created_at", range=rng)
            order = qe.OrderBy("created_at", direction) if direction is not None else None
            found: list[tuple[str, dict]] = []
            for part in parts.parts:
                records, _ = part.shard.scroll(
                    qe.ScrollRequest(limit=n, filter=qe.Filter(must=[*must, cond]), with_payload=True, order_by=order)
                )
                found += _rows(records)
            if direction is not None and len(parts.parts) > 1:  # the nearest n of all parts
                found.sort(key=lambda row: row[1]["created_at"], reverse=direction == qe.Direction.Desc)
            return found[:n]

        before = scroll(qe.RangeFloat(lt=t_min), qe.Direction.Desc, edge)
        inside = scroll(qe.RangeFloat(gte=t_min, lte=t_max), None, limit)
        after = scroll(qe.RangeFloat(gt=t_max), qe.Direction.Asc, edge)
        return before, inside, after

    async def count_memories(self, f: PointFilter) -> int:
        parts = self._memory_shard(f.namespace, create=False)
        if parts is None:
            return 0
        return sum(part.shard.count(qe.CountRequest(exact=True, filter=self._filter(f))) for part in parts.parts)

    async def delete_memories_by_filter(self, f: PointFilter) -> int:
        parts = self._memory_shard(f.namespace, create=False)
        count = await self.count_memories(f)
        if parts is None or not count:
            return 0
        qfilter = self._filter(f)
        if qfilter is None:
            # The whole namespace, alone in its shards: drop them.
            self._memories.pop(parts.root.name, None)
            self._known.discard(parts.root.name)
            await parts.drop()
        else:
            for part in parts.parts:
                async with part.write_lock:
                    part.update(qe.UpdateOperation.delete_points_by_filter(qfilter))
        return count

    async def delete_memories_by_ids(self, namespace: str, ids: Sequence[str]) -> None:
        parts = self._memory_shard(namespace, create=False)
        if ids and parts is not None:
            for part, held in parts.holders(list(ids)):
                async with part.write_lock:
                    part.update(qe.UpdateOperation.delete_points(list[Any](held)), touched=held)
