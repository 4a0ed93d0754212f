"""Memory service knobs, from AGENTMESH_MEMORY_* and AGENTMESH_EMBEDDER / AGENTMESH_EMBEDDINGS_* (docs/memory.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from agentmesh.config import env_bool, env_choice, env_float, env_int, env_str

EMBEDDERS = ("hashing", "openai", "local")
FUSIONS = ("rrf", "dbsf", "weighted")
LAYOUTS = ("auto", "shared", "per-namespace")


@dataclass(frozen=True)
class MemorySettings:
    # --- embedders ---
    # "hashing": feature hashing of words and character n-grams, offline and dependency-free;
    # "openai": any OpenAI-compatible /embeddings endpoint; "local": all-MiniLM-L6-v2 from the
    # optional `local-embeddings` extra.
    embedder: str = "hashing"
    hashing_dim: int = 512
    embeddings_base_url: str = "http://localhost:11434/v1"
    embeddings_model: str = "nomic-embed-text"
    embeddings_api_key: str = field(default="", repr=False)
    embeddings_timeout_s: float = 60.0
    embeddings_batch: int = 64

    # --- retrieval (defaults chosen by benches/locomo.py; see docs/memory.md) ---
    # Weighted reciprocal rank fusion in Qdrant: each side adds 1 / ((rank + 1) / weight + rrf_k - 1),
    # i.e. a weight w makes rank r count like rank r / w.
    fusion: str = "weighted"
    # 0 = by embedder: a weak dense signal (hashing) gets 0.1, a trained model 0.35.
    dense_weight: float = 0.0
    sparse_weight: float = 1.0
    rrf_k: int = 5
    # How many candidates each retriever hands to the fusion step, as a multiple of k.
    prefetch_factor: int = 4
    # Neighbour context (context.py): how much a neighbouring memory's words count in a memory's
    # sparse vector (0 disables), how many neighbours on each side, and whether the dense vector
    # embeds the neighbours' text too.
    context_weight: float = 0.5
    context_window: int = 1
    # Only fragments of a stream need their neighbours (conversation turns); a saved fact is
    # meant to stand alone.
    context_kinds: tuple[str, ...] = ("episode",)
    dense_context: bool = False
    # Re-ranking after fusion: a memory gains this share of its best neighbour's fused score when
    # that neighbour is among the candidates (the answer often sits next to the best match).
    neighbor_boost: float = 0.4
    # Index the memory's date ("8 May 2023") as words, so "what happened in May" can match.
    index_dates: bool = True

    # Memory collections: "shared" (one, namespace as a tenant-indexed field), "per-namespace",
    # or "auto" = per-namespace embedded, shared against a server (memories.py says why).
    layout: str = "auto"

    # --- bounds ---
    max_content_bytes: int = 1024 * 1024
    max_memory_bytes: int = 64 * 1024
    max_messages_per_append: int = 1000
    max_import: int = 10_000
    # Each standing-instruction part (soul, user, project): every turn of the namespace carries it.
    profile_max_chars: int = 4000
    # Tools the agent may promote from its own functions, per namespace.
    promoted_tools_max: int = 20

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "MemorySettings":
        return cls(
            embedder=env_choice(env, "AGENTMESH_EMBEDDER", cls.embedder, EMBEDDERS),
            hashing_dim=env_int(env, "AGENTMESH_EMBEDDER_HASHING_DIM", cls.hashing_dim, minimum=16),
            embeddings_base_url=env_str(env, "AGENTMESH_EMBEDDINGS_BASE_URL", cls.embeddings_base_url).rstrip("/"),
            embeddings_model=env_str(env, "AGENTMESH_EMBEDDINGS_MODEL", cls.embeddings_model),
            embeddings_api_key=env_str(env, "AGENTMESH_EMBEDDINGS_API_KEY"),
            embeddings_timeout_s=env_float(env, "AGENTMESH_EMBEDDINGS_TIMEOUT_S", cls.embeddings_timeout_s, minimum=1),
            embeddings_batch=env_int(env, "AGENTMESH_EMBEDDINGS_BATCH", cls.embeddings_batch, minimum=1),
            fusion=env_choice(env, "AGENTMESH_MEMORY_FUSION", cls.fusion, FUSIONS),
            dense_weight=env_float(env, "AGENTMESH_MEMORY_DENSE_WEIGHT", cls.dense_weight, minimum=0),
            sparse_weight=env_float(env, "AGENTMESH_MEMORY_SPARSE_WEIGHT", cls.sparse_weight, minimum=0),
            rrf_k=env_int(env, "AGENTMESH_MEMORY_RRF_K", cls.rrf_k, minimum=1),
            prefetch_factor=env_int(env, "AGENTMESH_MEMORY_PREFETCH_FACTOR", cls.prefetch_factor, minimum=1),
            context_weight=env_float(env, "AGENTMESH_MEMORY_CONTEXT_WEIGHT", cls.context_weight, minimum=0),
            context_window=env_int(env, "AGENTMESH_MEMORY_CONTEXT_WINDOW", cls.context_window, minimum=0),
            context_kinds=tuple(
                k.strip()
                for k in env_str(env, "AGENTMESH_MEMORY_CONTEXT_KINDS", ",".join(cls.context_kinds)).split(",")
                if k.strip()
            ),
            dense_context=env_bool(env, "AGENTMESH_MEMORY_DENSE_CONTEXT", cls.dense_context),
            neighbor_boost=env_float(env, "AGENTMESH_MEMORY_NEIGHBOR_BOOST", cls.neighbor_boost, minimum=0),
            index_dates=env_bool(env, "AGENTMESH_MEMORY_INDEX_DATES", cls.index_dates),
            layout=env_choice(env, "AGENTMESH_MEMORY_LAYOUT", cls.layout, LAYOUTS),
            max_content_bytes=env_int(env, "AGENTMESH_MEMORY_MAX_CONTENT_BYTES", cls.max_content_bytes, minimum=1),
            max_memory_bytes=env_int(env, "AGENTMESH_MEMORY_MAX_MEMORY_BYTES", cls.max_memory_bytes, minimum=1),
            profile_max_chars=env_int(env, "AGENTMESH_PROFILE_MAX_CHARS", cls.profile_max_chars, minimum=1),
            promoted_tools_max=env_int(env, "AGENTMESH_PROMOTED_TOOLS_MAX", cls.promoted_tools_max, minimum=0),
        )
