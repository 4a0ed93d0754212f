"""Which adapter of the storage port (ports.Store) the memory service runs on.

AGENTMESH_QDRANT_URL set: a Qdrant server through qdrant-client (qdrant_store.py). Otherwise
Qdrant Edge embedded under AGENTMESH_HOME (edge_store.py), after moving a home that the old
local mode wrote into it (migrate.py). The document store (ports.DocumentStore) always lives in
the same place as the memory store: `open_documents` picks its adapter by the store's.

The Qdrant server's adapters are imported only when a server is configured: qdrant-client takes
about a second of CPU to import, which every start of an embedded (Edge) memory service paid.
"""

from __future__ import annotations

from pathlib import Path

from agentmesh.logs import get_logger
from agentmesh.memory.edge_documents import EdgeDocuments
from agentmesh.memory.edge_store import EdgeStore
from agentmesh.memory.migrate import migrate, needs_migration
from agentmesh.memory.ports import DocumentStore, Store
from agentmesh.memory.settings import MemorySettings

log = get_logger("agentmesh.memory")


async def open_store(home: Path, qdrant_url: str, settings: MemorySettings) -> Store:
    store: Store
    if qdrant_url:
        from agentmesh.memory.qdrant_store import QdrantStore

        store = QdrantStore.connect(qdrant_url, layout=settings.layout)
    else:
        store = EdgeStore(home, layout=settings.layout, index_after=settings.index_after,
                          part_size=settings.part_size)
    await store.open()
    if isinstance(store, EdgeStore) and needs_migration(home, store):
        log.info("migrating the local-mode store to Qdrant Edge", source=str(Path(home) / "qdrant"))
        try:
            last: dict[str, int] = {}

            def progress(what: str, done: int, total: int) -> None:
                # A line per tenth of each collection: enough to see it move in the service log.
                step = max(1, total // 10)
                if done // step != last.get(what, -1) or done == total:
                    last[what] = done // step
                    log.info("migrating", collection=what, done=done, total=total)

            counts = await migrate(home, store, progress)
            log.info("migration finished; the old qdrant/ directory is left for you to remove", **counts)
        except BaseException:
            await store.close()
            raise
    return store


async def open_documents(store: Store) -> DocumentStore:
    """The document store beside an open `store` (open_store's): a shard of the same Edge home,
    or a collection on the same Qdrant server through the same client."""
    documents: DocumentStore
    if isinstance(store, EdgeStore):
        documents = EdgeDocuments(store)
    else:
        from agentmesh.memory.qdrant_documents import QdrantDocuments
        from agentmesh.memory.qdrant_store import QdrantStore

        if not isinstance(store, QdrantStore):
            raise TypeError(f"no document store goes with {type(store).__name__}")
        documents = QdrantDocuments.beside(store)
    await documents.open()
    return documents

