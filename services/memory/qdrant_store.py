"""The storage port (ports.py) over a Qdrant server, through qdrant-client: collections, points,
filters and hybrid queries.

Used when AGENTMESH_QDRANT_URL names a server. It also opens qdrant-client's embedded *local mode*
(`QdrantClient(path=...)`, a pure-Python stand-in, the embedded store before Qdrant Edge): the
conformance tests run this adapter against it, and `migrate.py` reads old homes through it. Local
mode is synchronous, single-process and not thread-safe, so every call runs on a private
executor: one worker in local mode (calls are serialised), several against a server (the gRPC
client is thread-safe). The same code path serves both.
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterable, Sequence

from qdrant_client import QdrantClient
from qdrant_client import models as qm

from agentmesh.errors import FailedPrecondition, Unavailable
from agentmesh.logs import get_logger
from agentmesh.memory.ports import DENSE, SPARSE, VECTOR_KEY, FusionPlan, MemoryRow, PointFilter, ScoredRow, point_id

log = get_logger("agentmesh.memory.qdrant")

SESSIONS = "agentmesh_sessions"
NAMESPACES = "agentmesh_namespaces"  # namespace settings, one point each
MESSAGES = "agentmesh_messages"
MEMORIES = "agentmesh_memories"
USAGE = "agentmesh_usage"


def _match(key: str, value: Any) -> qm.FieldCondition:
    if isinstance(value, float):
        # MatchValue takes strings, integers and booleans; a fractional number matches as a point range.
        return qm.FieldCondition(key=key, range=qm.Range(gte=value, lte=value))
    return qm.FieldCondition(key=key, match=qm.MatchValue(value=value))


def to_qdrant_filter(f: PointFilter, with_namespace: bool = True) -> qm.Filter:
    must: list[qm.Condition] = [_match("namespace", f.namespace)] if with_namespace else []
    if f.kinds:
        must.append(qm.FieldCondition(key="kind", match=qm.MatchAny(any=list(f.kinds))))
    for key, value in f.metadata:
        must.append(_match(f"metadata.{key}", value))
    if f.created_after or f.created_before:
        must.append(
            qm.FieldCondition(
                key="created_at",
                range=qm.Range(gte=f.created_after or None, lt=f.created_before or None),
            )
        )
    if f.source_session_id:
        must.append(_match("source_session_id", f.source_session_id))
    return qm.Filter(must=must)


class QdrantStore:
    def __init__(self, client: QdrantClient, *, local: bool, where: str, layout: str = "auto"):
        self._client = client
        self.local = local
        self.where = where
        self.layout = layout if layout != "auto" else ("per-namespace" if local else "shared")
        self._known: set[str] = set()  # memory collections known to exist and to match the embedder
        self._embedder: tuple[str, int] = ("", 0)
        self._create_lock = asyncio.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1 if local else 8, thread_name_prefix="qdrant")

    @classmethod
    def connect(cls, url: str = "", *, path: Path | None = None, layout: str = "auto") -> "QdrantStore":
        """A server at `url`, or qdrant-client's local mode in the directory `path`."""
        if url:
            client = QdrantClient(url=url, prefer_grpc=True, timeout=30)
            return cls(client, local=False, where=url, layout=layout)
        assert path is not None, "give a server url or a local-mode path"
        path.mkdir(parents=True, exist_ok=True)
        try:
            client = QdrantClient(path=str(path))
        except RuntimeError as exc:  # the local store's file lock is held by another process
            raise FailedPrecondition(f"the local-mode Qdrant store at {path} is in use by another process ({exc})") from None
        return cls(client, local=True, where=str(path), layout=layout)

    async def _run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))
        except Exception as exc:
            if self.local or type(exc).__module__.startswith("agentmesh"):
                raise
            raise Unavailable(f"Qdrant at {self.where} failed: {type(exc).__name__}: {exc}") from exc

    def shared(self) -> tuple[QdrantClient, Callable[..., Awaitable[Any]]]:
        """The client and the runner bound to this store's executor, for adapters of other
        collections in the same store (qdrant_documents.py): the embedded store allows one client."""
        return self._client, self._run

    async def close(self) -> None:
        await self._run(self._client.close)
        self._executor.shutdown(wait=True)

    # ------------------------------------------------------------------ set-up

    async def _ensure(self, name: str, indexes: Iterable[tuple[str, Any]] = (), **config: Any) -> bool:
        """Create collection `name` unless it exists; returns True when it was created."""
        if await self._run(self._client.collection_exists, name):
            return False
        await self._run(self._client.create_collection, name, **config)
        if not self.local:  # local mode has no payload indexes (and warns about them)
            for field_name, schema in indexes:
                await self._run(self._client.create_payload_index, name, field_name, field_schema=schema)
        return True

    async def open(self) -> None:
        await self._ensure(SESSIONS, [("created_at", qm.PayloadSchemaType.FLOAT)], vectors_config={})
        await self._ensure(NAMESPACES, vectors_config={})
        await self._ensure(
            MESSAGES,
            [
                ("session_id", qm.KeywordIndexParams(type=qm.KeywordIndexType.KEYWORD, is_tenant=True)),
                ("seq", qm.PayloadSchemaType.INTEGER),
            ],
            vectors_config={},
        )
        await self._ensure(USAGE, [("at", qm.PayloadSchemaType.FLOAT)], vectors_config={})

    def memory_collection(self, namespace: str) -> str:
        if self.layout == "shared":
            return MEMORIES
        # Collection names allow a narrow alphabet; escape the rest of the namespace reversibly.
        escaped = "".join(c if c.isalnum() or c in "-" else f"_{ord(c):02x}" for c in namespace)
        return f"{MEMORIES}__{escaped}"

    def _memory_filter(self, f: PointFilter) -> qm.Filter | None:
        qfilter = to_qdrant_filter(f, with_namespace=self.layout == "shared")
        return qfilter if qfilter.must else None

    async def check_embedder(self, embedder: str, dim: int) -> str:
        """Check every memory collection against `embedder`; return why memory cannot be used, or ''.

        Collections record which embedder filled them. Vectors of another model (or size)
        would silently answer nonsense, so a mismatch is refused, not mixed in.
        """
        self._embedder = (embedder, dim)
        names = [c.name for c in (await self._run(self._client.get_collections)).collections]
        ours = [n for n in names if n == MEMORIES or n.startswith(f"{MEMORIES}__")]
        for name in ours:
            info = await self._run(self._client.get_collection, name)
            stored = dict(info.config.metadata or {})
            vectors = info.config.params.vectors
            stored_dim = vectors[DENSE].size if isinstance(vectors, dict) and DENSE in vectors else None
            stored_embedder = stored.get("embedder", "unknown")
            if stored_dim != dim or stored_embedder != embedder:
                return (
                    f"long-term memory in {self.where} was embedded with {stored_embedder} ({stored_dim} dimensions) "
                    f"but the service is configured with {embedder} ({dim} dimensions); set AGENTMESH_EMBEDDER "
                    "(and AGENTMESH_EMBEDDINGS_MODEL) back, or move the old store away to start a new one"
                )
            self._known.add(name)
        if self.layout == "shared":
            await self._ensure_memories("")
        return ""

    async def _ensure_memories(self, namespace: str) -> str:
        name = self.memory_collection(namespace)
        if name in self._known:
            return name
        async with self._create_lock:
            await self._create_memories(name, namespace)
        return name

    async def _create_memories(self, name: str, namespace: str) -> None:
        if name in self._known:
            return
        embedder, dim = self._embedder
        await self._ensure(
            name,
            [
                ("namespace", qm.KeywordIndexParams(type=qm.KeywordIndexType.KEYWORD, is_tenant=True)),
                ("kind", qm.PayloadSchemaType.KEYWORD),
                ("source_session_id", qm.PayloadSchemaType.KEYWORD),
                ("created_at", qm.PayloadSchemaType.FLOAT),
            ],
            vectors_config={DENSE: qm.VectorParams(size=dim, distance=qm.Distance.COSINE)},
            sparse_vectors_config={SPARSE: qm.SparseVectorParams(modifier=qm.Modifier.IDF)},
            metadata={"embedder": embedder, "dim": dim, "namespace": namespace if self.layout != "shared" else ""},
        )
        self._known.add(name)

    def _existing(self, namespace: str) -> str | None:
        """The namespace's collection if it exists (reads of an unknown namespace find nothing)."""
        name = self.memory_collection(namespace)
        return name if name in self._known else None

    # ---------------------------------------------------------------- sessions

    async def get_session(self, session_id: str) -> dict | None:
        points = await self._run(self._client.retrieve, SESSIONS, [point_id("session", session_id)], with_payload=True)
        return dict(points[0].payload) if points else None

    async def put_session(self, payload: dict) -> None:
        point = qm.PointStruct(id=point_id("session", payload["session_id"]), vector={}, payload=payload)
        await self._run(self._client.upsert, SESSIONS, [point], wait=True)

    async def get_namespace_settings(self, namespace: str) -> dict | None:
        points = await self._run(self._client.retrieve, NAMESPACES, [point_id("namespace", namespace)], with_payload=True)
        return dict(points[0].payload) if points else None

    async def put_namespace_settings(self, payload: dict) -> None:
        point = qm.PointStruct(id=point_id("namespace", payload["namespace"]), vector={}, payload=payload)
        await self._run(self._client.upsert, NAMESPACES, [point], wait=True)

    async def list_sessions(self, limit: int, start_before: float | None,
                            namespaces: frozenset[str] | None = None) -> list[dict]:
        """Sessions newest first, starting at created_at <= start_before (ties included)."""
        order = qm.OrderBy(key="created_at", direction=qm.Direction.DESC, start_from=start_before)
        if namespaces is not None and not namespaces:
            return []
        selector = None if namespaces is None else qm.Filter(
            must=[qm.FieldCondition(key="namespace", match=qm.MatchAny(any=sorted(namespaces)))])
        points, _ = await self._run(self._client.scroll, SESSIONS, limit=limit, order_by=order,
                                    scroll_filter=selector, with_payload=True)
        return [dict(p.payload) for p in points]

    async def child_sessions(self, session_id: str, label: str) -> list[str]:
        """Ids of the sessions whose `label` names `session_id` as their parent."""
        found, offset = [], None
        selector = qm.Filter(must=[_match(f"labels.{label}", session_id)])
        while True:
            points, offset = await self._run(
                self._client.scroll, SESSIONS, scroll_filter=selector, limit=256, offset=offset, with_payload=["session_id"]
            )
            found += [p.payload["session_id"] for p in points]
            if offset is None:
                return found

    async def delete_session(self, session_id: str) -> None:
        # The record goes first: a crash in between leaves unreachable messages (a re-created
        # session starts at seq 1 and overwrites them), never a session that lost its history.
        await self._run(self._client.delete, SESSIONS, [point_id("session", session_id)], wait=True)
        selector = qm.FilterSelector(filter=qm.Filter(must=[_match("session_id", session_id)]))
        await self._run(self._client.delete, MESSAGES, selector, wait=True)

    # ---------------------------------------------------------------- messages

    async def put_messages(self, session_id: str, payloads: Sequence[dict]) -> None:
        points = [
            qm.PointStruct(id=point_id("message", session_id, str(p["seq"])), vector={}, payload=p) for p in payloads
        ]
        await self._run(self._client.upsert, MESSAGES, points, wait=True)

    async def append_messages(self, session_id: str, payloads: Sequence[dict], session: dict) -> None:
        await self.put_messages(session_id, payloads)
        await self.put_session(session)

    async def get_messages(self, session_id: str, seqs: Sequence[int]) -> list[dict]:
        ids = [point_id("message", session_id, str(seq)) for seq in seqs]
        points = await self._run(self._client.retrieve, MESSAGES, ids, with_payload=True)
        found = [dict(p.payload) for p in points]
        return sorted(found, key=lambda p: p["seq"])

    async def put_model_calls(self, payloads: Sequence[dict]) -> None:
        # In the messages collection, so deleting the session's messages takes them along.
        points = [qm.PointStruct(id=point_id("model_call", p["session_id"], p["id"]), vector={},
                                 payload={**p, "kind": "model_call"}) for p in payloads]
        if points:
            await self._run(self._client.upsert, MESSAGES, points, wait=True)

    async def list_model_calls(self, session_id: str) -> list[dict]:
        selector = qm.Filter(must=[_match("session_id", session_id), _match("kind", "model_call")])
        found: list[dict] = []
        offset = None
        while True:
            points, offset = await self._run(self._client.scroll, MESSAGES, scroll_filter=selector, limit=256,
                                             offset=offset, with_payload=True)
            found += [{k: v for k, v in (p.payload or {}).items() if k != "kind"} for p in points]
            if offset is None:
                return found

    # ---------------------------------------------------------------- memories

    async def get_memories(self, namespace: str, ids: Sequence[str]) -> dict[str, dict]:
        """Payloads of the namespace's points with these ids that exist, by point id."""
        name = self._existing(namespace)
        if not ids or name is None:
            return {}
        points = await self._run(self._client.retrieve, name, list(ids), with_payload=True)
        return {str(p.id): dict(p.payload) for p in points if p.payload.get("namespace") == namespace}

    async def upsert_memories(self, namespace: str, rows: Sequence[MemoryRow]) -> None:
        name = await self._ensure_memories(namespace)
        points = [
            qm.PointStruct(
                id=pid,
                vector={DENSE: dense, SPARSE: qm.SparseVector(indices=sparse[0], values=sparse[1])},
                payload=payload,
            )
            for pid, dense, sparse, payload in rows
        ]
        await self._run(self._client.upsert, name, points, wait=True)

    def _sparse_params(self, qfilter: qm.Filter | None) -> qm.SearchParams | None:
        # In a shared collection, IDF is computed over the namespace's own memories, so one
        # tenant's vocabulary never shifts another's ranking (a collection per namespace has that built in).
        if self.layout == "shared" and qfilter is not None and isinstance(qfilter.must, list):
            return qm.SearchParams(idf=qm.IdfCorpusParams(corpus=qm.Filter(must=[qfilter.must[0]])))
        return None

    async def hybrid_search(
        self,
        f: PointFilter,
        dense: list[float],
        sparse: tuple[list[int], list[float]],
        limit: int,
        plan: FusionPlan,
    ) -> list[ScoredRow]:
        name = self._existing(f.namespace)
        if name is None:
            return []
        qfilter = self._memory_filter(f)
        prefetch = [qm.Prefetch(query=dense, using=DENSE, filter=qfilter, limit=plan.prefetch_limit)]
        if sparse[0]:
            prefetch.append(
                qm.Prefetch(
                    query=qm.SparseVector(indices=sparse[0], values=sparse[1]),
                    using=SPARSE,
                    filter=qfilter,
                    params=self._sparse_params(qfilter),
                    limit=plan.prefetch_limit,
                )
            )
        if plan.fusion == "dbsf":
            query: Any = qm.FusionQuery(fusion=qm.Fusion.DBSF)
        else:
            weights = [plan.dense_weight, plan.sparse_weight][: len(prefetch)] if plan.fusion == "weighted" else None
            query = qm.RrfQuery(rrf=qm.Rrf(k=plan.rrf_k, weights=weights))
        result = await self._run(
            self._client.query_points, name, prefetch=prefetch, query=query, limit=limit, with_payload=True
        )
        return [(str(p.id), float(p.score), dict(p.payload)) for p in result.points]

    async def ranked(self, f: PointFilter, vector: Any, using: str, limit: int) -> list[ScoredRow]:
        """One retriever on its own (benches compare it with the fused result)."""
        name = self._existing(f.namespace)
        if name is None:
            return []
        qfilter = self._memory_filter(f)
        if isinstance(vector, tuple):
            vector = qm.SparseVector(indices=vector[0], values=vector[1])
        params = self._sparse_params(qfilter) if using == SPARSE else None
        result = await self._run(
            self._client.query_points,
            name,
            query=vector,
            using=using,
            query_filter=qfilter,
            search_params=params,
            limit=limit,
            with_payload=True,
        )
        return [(str(p.id), float(p.score), dict(p.payload)) for p in result.points]

    async def scroll_memories(
        self, f: PointFilter, limit: int, offset: str | None, with_vectors: bool = False
    ) -> tuple[list[tuple[str, dict]], str]:
        name = self._existing(f.namespace)
        if name is None:
            return [], ""
        points, next_offset = await self._run(
            self._client.scroll,
            name,
            scroll_filter=self._memory_filter(f),
            limit=limit,
            offset=offset,
            with_payload=True,
            with_vectors=[DENSE] if with_vectors else False,
        )
        rows = [(str(p.id), dict(p.payload)) for p in points]
        if with_vectors:
            for (_, payload), p in zip(rows, points, strict=True):
                found = p.vector.get(DENSE) if isinstance(p.vector, dict) else p.vector
                payload[VECTOR_KEY] = [float(x) for x in found or ()]
        return rows, ("" if next_offset is None else str(next_offset))

    async def stream_window(
        self, f: PointFilter, t_min: float, t_max: float, edge: int = 2, limit: int = 10_000
    ) -> tuple[list[tuple[str, dict]], list[tuple[str, dict]], list[tuple[str, dict]]]:
        """Memories matching `f`: the `edge` nearest before t_min (nearest first), those created in
        [t_min, t_max], and the `edge` nearest after t_max."""
        name = self._existing(f.namespace)
        if name is None:
            return [], [], []
        base = self._memory_filter(f)
        must: list[qm.Condition] = list(base.must) if base and isinstance(base.must, list) else []

        def scroll(rng: qm.Range, direction: qm.Direction | None, n: int) -> list[tuple[str, dict]]:
            cond = qm.FieldCondition(key="created_at", range=rng)
            order = qm.OrderBy(key="created_at", direction=direction) if direction else None
            points, _ = self._client.scroll(
                name, scroll_filter=qm.Filter(must=[*must, cond]), limit=n, order_by=order, with_payload=True
            )
            return [(str(p.id), dict(p.payload or {})) for p in points]

        def window():
            before = scroll(qm.Range(lt=t_min), qm.Direction.DESC, edge)
            inside = scroll(qm.Range(gte=t_min, lte=t_max), None, limit)
            after = scroll(qm.Range(gt=t_max), qm.Direction.ASC, edge)
            return before, inside, after

        return await self._run(window)

    async def count_memories(self, f: PointFilter) -> int:
        name = self._existing(f.namespace)
        if name is None:
            return 0
        result = await self._run(self._client.count, name, count_filter=self._memory_filter(f), exact=True)
        return int(result.count)

    async def delete_memories_by_filter(self, f: PointFilter) -> int:
        name = self._existing(f.namespace)
        count = await self.count_memories(f)
        if name is None or not count:
            return 0
        qfilter = self._memory_filter(f)
        if qfilter is None:
            # The whole namespace, alone in its collection: drop the collection.
            await self._run(self._client.delete_collection, name)
            self._known.discard(name)
        else:
            await self._run(self._client.delete, name, qm.FilterSelector(filter=qfilter), wait=True)
        return count

    async def delete_memories_by_ids(self, namespace: str, ids: Sequence[str]) -> None:
        name = self._existing(namespace)
        if ids and name is not None:
            await self._run(self._client.delete, name, qm.PointIdsList(points=list(ids)), wait=True)

    # ---------------------------------------------------------------- usage

    async def put_usage(self, payloads: Sequence[dict]) -> None:
        points = [qm.PointStruct(id=point_id("usage", p["id"]), vector={}, payload=p) for p in payloads]
        if points:
            await self._run(self._client.upsert, USAGE, points, wait=True)

    async def delete_usage(self, ids: Sequence[str]) -> None:
        if ids:
            points: list[Any] = [point_id("usage", i) for i in ids]
            await self._run(self._client.delete, USAGE, qm.PointIdsList(points=points), wait=True)

    async def scroll_usage(self, start: float, end: float, limit: int, offset: str | None) -> tuple[list[dict], str]:
        timed = qm.FieldCondition(key="at", range=qm.Range(gte=start or None, lt=end or None))
        points, next_offset = await self._run(
            self._client.scroll, USAGE, scroll_filter=qm.Filter(must=[timed]), limit=limit, offset=offset,
            with_payload=True,
        )
        return [dict(p.payload or {}) for p in points], ("" if next_offset is None else str(next_offset))
