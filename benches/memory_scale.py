"""Long-term memory at scale, embedded mode: ingest throughput and search latency p50/p99.

    .venv/bin/python -m benches.memory_scale [--sizes 10000,100000] [--queries 100] [--budget-s 600]

One namespace is filled with synthetic memories (sentences over a 20k-word vocabulary with a
Zipf-like spread, so BM25 has common and rare words) through the service core's Import in
batches of 256, on embedded Qdrant (qdrant-client local mode, persisted under a temp home),
hashing embedder. Then hybrid searches with 4-6 words drawn from stored memories. Beside it,
the baseline a single-process server would have: the same memories in plain Python lists with
BM25 computed by a loop over an inverted index, same queries. When filling a size would take
longer than --budget-s, the run stops there and reports the size reached.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from agentmesh.memory.embedders import HashingEmbedder
from agentmesh.memory.memories import Memories, RememberItem
from agentmesh.memory.qdrant_store import QdrantStore
from agentmesh.memory.settings import MemorySettings

BATCH = 256


def vocabulary(rng: random.Random, size: int = 20_000) -> list[str]:
    syllables = ["ka", "lo", "mi", "ra", "te", "su", "no", "vi", "da", "pe", "zo", "an", "el", "or", "un", "is"]
    words = set()
    while len(words) < size:
        words.add("".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))))
    return sorted(words)


def sentences(n: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    vocab = vocabulary(rng)
    weights = [1 / (rank + 1) for rank in range(len(vocab))]  # Zipf: a few words everywhere, most rare
    return [" ".join(rng.choices(vocab, weights, k=rng.randint(8, 20))) for _ in range(n)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def baseline_bm25(texts: list[str], queries: list[str]) -> list[float]:
    """A single-process server's search: an inverted index in dicts, BM25 in a loop."""
    postings: dict[str, list[tuple[int, int]]] = defaultdict(list)
    lengths = []
    for i, text in enumerate(texts):
        words = text.split()
        lengths.append(len(words))
        for word, tf in Counter(words).items():
            postings[word].append((i, tf))
    avg, n = sum(lengths) / len(lengths), len(texts)
    latencies = []
    for query in queries:
        started = time.perf_counter()
        scores: dict[int, float] = defaultdict(float)
        for word in set(query.split()):
            plist = postings.get(word, [])
            idf = math.log((n - len(plist) + 0.5) / (len(plist) + 0.5) + 1)
            for doc, tf in plist:
                scores[doc] += idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * lengths[doc] / avg))
        sorted(scores.items(), key=lambda kv: -kv[1])[:10]
        latencies.append(time.perf_counter() - started)
    return latencies


async def run_size(size: int, n_queries: int, budget_s: float) -> dict:
    texts = sentences(size)
    rng = random.Random(size)
    settings = MemorySettings()
    with tempfile.TemporaryDirectory() as home:
        store = QdrantStore.open(Path(home), layout=settings.layout)
        memories = Memories(store, HashingEmbedder(settings.hashing_dim), settings)
        try:
            await memories.open()
            started = time.perf_counter()
            stored = 0
            for start in range(0, size, BATCH):
                batch = [
                    RememberItem(namespace="scale", text=t, kind="knowledge") for t in texts[start : start + BATCH]
                ]
                stored += await memories.import_many("scale", batch)
                if time.perf_counter() - started > budget_s:
                    break
            ingest_s = time.perf_counter() - started
            queries = [" ".join(rng.sample(texts[rng.randrange(stored)].split(), 4)) for _ in range(n_queries)]
            latencies = []
            for query in queries:
                t0 = time.perf_counter()
                await memories.search("scale", query, 10)
                latencies.append(time.perf_counter() - t0)
        finally:
            await store.close()
    base = baseline_bm25(texts[:stored], queries)
    return {
        "size": size,
        "stored": stored,
        "ingest_per_s": stored / ingest_s,
        "p50": statistics.median(latencies) * 1000,
        "p99": percentile(latencies, 0.99) * 1000,
        "base_p50": statistics.median(base) * 1000,
        "base_p99": percentile(base, 0.99) * 1000,
        "queries": len(queries),
    }


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benches.memory_scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--budget-s", type=float, default=600.0, help="stop filling a size after this long")
    args = parser.parse_args(argv)
    print(
        f"{'memories':>9} {'stored':>7} {'ingest/s':>9} {'search p50 ms':>14} {'p99 ms':>8} "
        f"{'baseline p50 ms':>16} {'p99 ms':>8} {'queries':>8}"
    )
    for size in (int(s) for s in args.sizes.split(",") if s):
        # Fewer queries at sizes where one search takes seconds in local mode.
        r = await run_size(size, args.queries if size <= 20_000 else max(10, args.queries // 5), args.budget_s)
        print(
            f"{r['size']:>9} {r['stored']:>7} {r['ingest_per_s']:>9.0f} {r['p50']:>14.1f} {r['p99']:>8.1f} "
            f"{r['base_p50']:>16.2f} {r['base_p99']:>8.2f} {r['queries']:>8}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
