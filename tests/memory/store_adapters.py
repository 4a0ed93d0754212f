"""The adapters every storage-port conformance suite runs against (tests/memory/test_*_port.py):

- `edge`, `edge-shared`: Qdrant Edge embedded (the default store), a shard per namespace / one shard;
- `edge-parts`: Qdrant Edge with parts of two memories (edge_parts.py), so that every case that
  writes more than two memories to a namespace crosses a part boundary;
- `server`: the Qdrant-server adapter (qdrant_store.QdrantStore) through qdrant-client's local mode.

There is no Qdrant server binary here, so the server adapter runs against local mode: the same
client API and models, so every request it builds is accepted and answered with the documented
semantics - but local mode is qdrant-client's Python re-implementation, not the server's engine,
and it ignores payload indexes (docs/memory.md says what this does and does not prove).

A suite takes the `store_factory` fixture (import it: `from tests.memory.store_adapters import
store_factory  # noqa: F401`): `store = await store_factory()`, `store = await store_factory.reopen(store)`.
"""

from __future__ import annotations

import pytest

from agentmesh.memory.edge_store import EdgeStore
from agentmesh.memory.ports import FusionPlan, point_id
from agentmesh.memory.qdrant_store import QdrantStore

ADAPTERS = ["edge", "edge-shared", "edge-parts", "server"]
DIM = 4
EMBEDDER = "test-embedder"


def make_store(kind: str, home):
    if kind == "edge":
        return EdgeStore(home, layout="per-namespace")
    if kind == "edge-shared":
        return EdgeStore(home, layout="shared")
    if kind == "edge-parts":
        return EdgeStore(home, layout="per-namespace", part_size=2)
    return QdrantStore.connect(path=home / "qdrant", layout="shared")


@pytest.fixture(params=ADAPTERS)
async def store_factory(request, tmp_path):
    opened = []

    async def open_store():
        store = make_store(request.param, tmp_path / "home")
        await store.open()
        assert await store.check_embedder(EMBEDDER, DIM) == ""
        opened.append(store)
        return store

    async def reopen(store):
        await store.close()
        opened.remove(store)
        return await open_store()

    open_store.reopen = reopen
    yield open_store
    for store in opened:
        await store.close()


def memory(namespace, mid, text, *, kind="fact", created_at=1000.0, session="", metadata=None):
    return {
        "id": mid, "namespace": namespace, "text": text, "kind": kind, "metadata": metadata or {},
        "created_at": created_at, "updated_at": created_at, "source_session_id": session,
    }


def row(payload, dense, terms):
    """A memory row with a sparse vector of term ids (weight 1 each)."""
    return (point_id("memory", payload["namespace"], payload["id"]), dense, (sorted(terms), [1.0] * len(terms)), payload)


PLAN = FusionPlan(fusion="weighted", prefetch_limit=20, rrf_k=5, dense_weight=0.1, sparse_weight=1.0)
