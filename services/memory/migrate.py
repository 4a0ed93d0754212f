"""Moves a home written by qdrant-client's local mode (`$AGENTMESH_HOME/qdrant/`) into Qdrant Edge.

Runs on the memory service's first start on such a home, or by hand:

    agentmesh memory migrate

Sessions, transcript messages and memories are copied as they are - payloads, and the memories'
dense and sparse vectors (no re-embedding, so the embedder each collection recorded comes along).
Writes are idempotent upserts by point id: an interrupted migration simply runs again. When it
has finished, `memory/MIGRATED` records the counts; the old `qdrant/` directory is left for the
user to remove.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

from agentmesh.logs import get_logger
from agentmesh.memory.edge_store import EdgeStore
from agentmesh.memory.ports import DENSE, SPARSE

log = get_logger("agentmesh.memory.migrate")

MARKER = "MIGRATED"
PAGE = 512

Progress = Callable[[str, int, int], None]  # (what, done, total)


def local_mode_dir(home: Path) -> Path:
    return Path(home) / "qdrant"


def needs_migration(home: Path, store: EdgeStore) -> bool:
    return (local_mode_dir(home) / "collection").is_dir() and not (store.root / MARKER).exists()


def _sparse(vector) -> tuple[list[int], list[float]]:
    return (list(vector.indices), list(vector.values)) if vector is not None else ([], [])


async def migrate(home: Path, store: EdgeStore, progress: Progress | None = None) -> dict[str, int]:
    """Copy everything from local mode into the open `store`; returns counts per kind."""
    from qdrant_client import QdrantClient  # only here: the service itself no longer needs local mode

    from agentmesh.memory.qdrant_store import MEMORIES, MESSAGES, SESSIONS  # imports qdrant_client

    report = progress or (lambda what, done, total: None)
    client = QdrantClient(path=str(local_mode_dir(home)))
    counts = {"sessions": 0, "messages": 0, "memories": 0}
    started = time.monotonic()
    try:
        names = [c.name for c in client.get_collections().collections]

        def pages(name: str, with_vectors: bool = False):
            total = client.count(name, exact=True).count
            offset, done = None, 0
            while True:
                points, offset = client.scroll(name, limit=PAGE, offset=offset, with_payload=True, with_vectors=with_vectors)
                done += len(points)
                yield points
                report(name, done, total)
                if offset is None:
                    return

        if SESSIONS in names:
            for points in pages(SESSIONS):
                for p in points:
                    await store.put_session(dict(p.payload))
                counts["sessions"] += len(points)
        if MESSAGES in names:
            for points in pages(MESSAGES):
                by_session: dict[str, list[dict]] = {}
                calls = [{k: v for k, v in p.payload.items() if k != "kind"} for p in points
                         if p.payload.get("kind") == "model_call"]
                for p in points:
                    if p.payload.get("kind") != "model_call":
                        by_session.setdefault(p.payload["session_id"], []).append(dict(p.payload))
                await store.put_model_calls(calls)
                for session_id, payloads in by_session.items():
                    await store.put_messages(session_id, payloads)
                counts["messages"] += len(points)
        for name in names:
            if name != MEMORIES and not name.startswith(f"{MEMORIES}__"):
                continue
            info = client.get_collection(name)
            recorded = dict(info.config.metadata or {})
            vectors = info.config.params.vectors
            assert isinstance(vectors, dict), f"{name} has no named vectors: not a memory collection"
            dim = vectors[DENSE].size
            # The shards remember the embedder that filled the collection; a service configured
            # with another one refuses long-term memory, as it did before the migration.
            await store.check_embedder(recorded.get("embedder", "unknown"), dim)
            for points in pages(name, with_vectors=True):
                by_namespace: dict[str, list] = {}
                for p in points:
                    row = (str(p.id), list(p.vector[DENSE]), _sparse(p.vector.get(SPARSE)), dict(p.payload))
                    by_namespace.setdefault(p.payload["namespace"], []).append(row)
                for namespace, rows in by_namespace.items():
                    await store.upsert_memories(namespace, rows)
                counts["memories"] += len(points)
    finally:
        client.close()
    await store.flush()
    marker = {**counts, "seconds": round(time.monotonic() - started, 1), "source": str(local_mode_dir(home))}
    (store.root / MARKER).write_text(json.dumps(marker))
    log.info("local-mode home migrated to Qdrant Edge", **marker)
    return counts
