"""Memory service knobs, from AGENTMESH_MEMORY_* and AGENTMESH_EMBEDDER / AGENTMESH_EMBEDDINGS_* (docs/memory.md)."""

from __future__ import annotations

from dataclasses import dataclass

from agentmesh.config import EnvSection, env

EMBEDDERS = ("hashing", "openai", "local", "onnx")
FUSIONS = ("rrf", "dbsf", "weighted")
LAYOUTS = ("auto", "shared", "per-namespace")


@dataclass(frozen=True)
class MemorySettings(EnvSection):
    # --- embedders ---
    # "hashing": feature hashing of words and character n-grams, offline and dependency-free;
    # "openai": any OpenAI-compatible /embeddings endpoint; "local": all-MiniLM-L6-v2 from the
    # optional `local-embeddings` extra (PyTorch); "onnx": the same model with int8 weights on
    # onnxruntime, from the optional `onnx-embeddings` extra (no PyTorch).
    embedder: str = env("AGENTMESH_EMBEDDER", "hashing", choices=EMBEDDERS)
    hashing_dim: int = env("AGENTMESH_EMBEDDER_HASHING_DIM", 512, minimum=16)
    embeddings_base_url: str = env("AGENTMESH_EMBEDDINGS_BASE_URL", "http://localhost:11434/v1")
    embeddings_model: str = env("AGENTMESH_EMBEDDINGS_MODEL", "nomic-embed-text")
    embeddings_api_key: str = env("AGENTMESH_EMBEDDINGS_API_KEY", "", secret=True)
    embeddings_timeout_s: float = env("AGENTMESH_EMBEDDINGS_TIMEOUT_S", 60.0, minimum=1)
    embeddings_batch: int = env("AGENTMESH_EMBEDDINGS_BATCH", 64, minimum=1)

    # --- retrieval (defaults chosen by benches/locomo.py; see docs/memory.md) ---
    # Weighted reciprocal rank fusion in Qdrant: each side adds 1 / ((rank + 1) / weight + rrf_k - 1),
    # i.e. a weight w makes rank r count like rank r / w.
    fusion: str = env("AGENTMESH_MEMORY_FUSION", "weighted", choices=FUSIONS)
    # 0 = by embedder: a weak dense signal (hashing) gets 0.1, a trained model 0.35.
    dense_weight: float = env("AGENTMESH_MEMORY_DENSE_WEIGHT", 0.0, minimum=0)
    sparse_weight: float = env("AGENTMESH_MEMORY_SPARSE_WEIGHT", 1.0, minimum=0)
    rrf_k: int = env("AGENTMESH_MEMORY_RRF_K", 5, minimum=1)
    # How many candidates each retriever hands to the fusion step, as a multiple of k.
    prefetch_factor: int = env("AGENTMESH_MEMORY_PREFETCH_FACTOR", 4, minimum=1)
    # Neighbour context (context.py): how much a neighbouring memory's words count in a memory's
    # sparse vector (0 disables; a neighbour d turns away counts weight ** d), how many neighbours
    # on each side, and whether the dense vector embeds the neighbours' text too. Two on each side:
    # a question and its answer are often a turn or two apart (benches/locomo.py, both halves).
    context_weight: float = env("AGENTMESH_MEMORY_CONTEXT_WEIGHT", 0.5, minimum=0)
    context_window: int = env("AGENTMESH_MEMORY_CONTEXT_WINDOW", 2, minimum=0)
    # Only fragments of a stream need their neighbours (conversation turns); a saved fact is
    # meant to stand alone.
    context_kinds: tuple[str, ...] = env("AGENTMESH_MEMORY_CONTEXT_KINDS", ("episode",))
    dense_context: bool = env("AGENTMESH_MEMORY_DENSE_CONTEXT", False)
    # Re-ranking after fusion: a memory gains this share of its best neighbour's fused score when
    # that neighbour is among the candidates (the answer often sits next to the best match).
    neighbor_boost: float = env("AGENTMESH_MEMORY_NEIGHBOR_BOOST", 0.4, minimum=0)
    # Index the memory's date ("8 May 2023") as words, so "what happened in May" can match.
    index_dates: bool = env("AGENTMESH_MEMORY_INDEX_DATES", True)

    # Memory collections/shards: "shared" (one, namespace as a tenant-indexed field),
    # "per-namespace", or "auto" = per-namespace embedded, shared against a server (docs/memory.md).
    layout: str = env("AGENTMESH_MEMORY_LAYOUT", "auto", choices=LAYOUTS)
    # Embedded: build a memory shard's HNSW index (in a separate process) once this many points
    # arrived since the last build; below it brute force answers fast enough. 0 = never.
    index_after: int = env("AGENTMESH_MEMORY_INDEX_AFTER", 20_000, minimum=0)
    # Embedded: a namespace's memories are kept in parts of at most this many (each an Edge shard,
    # indexed once when it is full); a build copies and reloads one part, not the namespace.
    # 0 = one part, however large.
    part_size: int = env("AGENTMESH_MEMORY_PART_SIZE", 200_000, minimum=0)

    # --- bounds ---
    max_content_bytes: int = env("AGENTMESH_MEMORY_MAX_CONTENT_BYTES", 1024 * 1024, minimum=1)
    max_memory_bytes: int = env("AGENTMESH_MEMORY_MAX_MEMORY_BYTES", 64 * 1024, minimum=1)
    max_messages_per_append: int = 1000
    max_import: int = 10_000
    # Each standing-instruction part (soul, user, project): every turn of the namespace carries it.
    profile_max_chars: int = env("AGENTMESH_PROFILE_MAX_CHARS", 4000, minimum=1)
    # Tools the agent may promote from its own functions, per namespace.
    promoted_tools_max: int = env("AGENTMESH_PROMOTED_TOOLS_MAX", 20, minimum=0)
    # Memory blocks (blocks.py): each block's bound (every turn of the namespace carries them all),
    # and how many a namespace may have.
    block_max_chars: int = env("AGENTMESH_BLOCK_MAX_CHARS", 2000, minimum=1)
    blocks_max: int = env("AGENTMESH_BLOCKS_MAX", 8, minimum=1)
    # Recall over conversations (recall.py): index appended user and assistant messages.
    conversation_index: bool = env("AGENTMESH_CONVERSATION_INDEX", True)
    # Records a retention or erasure pass looks at per kind (retention.py): bounds one call's work.
    retention_max_items: int = env("AGENTMESH_RETENTION_MAX_ITEMS", 1000, minimum=1, maximum=10_000)

    def __post_init__(self) -> None:
        object.__setattr__(self, "embeddings_base_url", self.embeddings_base_url.rstrip("/"))
