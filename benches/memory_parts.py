"""What one part of a namespace costs at a given size: the numbers AGENTMESH_MEMORY_PART_SIZE is
chosen from (docs/memory.md, "Bounded parts").

    .venv/bin/python -m benches.memory_parts [--sizes 50000,100000,200000] [--queries 100]

For each size, in a fresh home: that many memories are written into one namespace the way a bulk
import does (the memory core and the Edge store adapter, builds off), then

- **build**: the index builder (`python -m agentmesh.memory.edge_indexer`, as the service runs it:
  `nice 10`, one HNSW thread) on a copy of the part, wall time; and the copy's time and size;
- **swap stall**: Edge's `load` of the indexed part, timed while a thread of this process tries to
  wake every 1 ms: its worst lateness is how long the service would stop answering at the swap
  (Edge holds the GIL while it loads);
- **search**: the part's hybrid query through the memory core (no gRPC), p50/p99.

A namespace of N memories in parts of size P is searched over ceil(N / P) such parts; a build
copies one part and the swap reloads one part.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from agentmesh.memory.edge_store import EdgeStore
from agentmesh.memory.embedders import HashingEmbedder
from agentmesh.memory.memories import Memories
from agentmesh.memory.memory_records import RememberItem
from agentmesh.memory.settings import MemorySettings
from benches._memory_fixtures import BATCH, make_queries, ms, sentences


class Lateness:
    """A thread that sleeps 1 ms at a time and records how late it wakes."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.perf_counter()
            time.sleep(0.001)
            self.worst = max(self.worst, time.perf_counter() - t - 0.001)

    def __enter__(self) -> "Lateness":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _du_mb(path: Path) -> int:
    return int(subprocess.run(["du", "-sm", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


async def measure(size: int, n_queries: int) -> dict:
    settings = MemorySettings()
    texts = sentences(size)
    queries = make_queries(texts, n_queries, size)
    with tempfile.TemporaryDirectory(prefix="agentmesh-bench-parts-") as home:
        store = EdgeStore(Path(home), layout="per-namespace", index_after=0, part_size=size + BATCH)
        await store.open()
        memories = Memories(store, HashingEmbedder(settings.hashing_dim), settings)
        await memories.open()
        started = time.perf_counter()
        for start in range(0, size, BATCH):
            batch = [RememberItem(namespace="part", text=t, kind="knowledge") for t in texts[start : start + BATCH]]
            await memories.import_many("part", batch)
        fill_s = time.perf_counter() - started
        await store.close()
        root = Path(home) / "memory" / "memories" / "part"
        shard_dir = next(root.glob("gen-*"))
        copy = root / "copy"
        started = time.perf_counter()
        shutil.copytree(shard_dir, copy)
        copy_s = time.perf_counter() - started
        copy_mb = _du_mb(copy)
        started = time.perf_counter()
        indexer = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agentmesh.memory.edge_indexer", str(copy), stderr=asyncio.subprocess.PIPE)
        _, err = await indexer.communicate()
        if indexer.returncode != 0:
            raise RuntimeError(f"the index build failed: {err.decode()[-500:]}")
        build_s = time.perf_counter() - started
        shutil.rmtree(shard_dir)
        copy.rename(shard_dir)

        import qdrant_edge as qe

        with Lateness() as late:
            started = time.perf_counter()
            shard = qe.EdgeShard.load(str(shard_dir))
            load_s = time.perf_counter() - started
        stall_s = late.worst
        shard.close()

        store = EdgeStore(Path(home), layout="per-namespace", index_after=0, part_size=size + BATCH)
        await store.open()
        memories = Memories(store, HashingEmbedder(settings.hashing_dim), settings)
        await memories.open()
        for query in queries[:10]:
            await memories.search("part", query, 10)
        latencies = []
        for query in queries:
            t = time.perf_counter()
            await memories.search("part", query, 10)
            latencies.append(time.perf_counter() - t)
        await store.close()
    return {"size": size, "fill_s": fill_s, "copy_s": copy_s, "copy_mb": copy_mb, "build_s": build_s,
            "load_s": load_s, "stall_s": stall_s, "p50": ms(latencies), "p99": ms(latencies, 0.99),
            "load": os.getloadavg()[0]}


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benches.memory_parts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="50000,100000,200000")
    parser.add_argument("--queries", type=int, default=100)
    args = parser.parse_args(argv)
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start", flush=True)
    print(f"{'part':>8} {'copy s':>7} {'copy MB':>8} {'build s':>8} {'load s':>7} {'stall s':>8} "
          f"{'search p50':>11} {'p99':>6} {'load avg':>9}")
    for size in (int(s) for s in args.sizes.split(",") if s):
        r = await measure(size, args.queries)
        print(f"{r['size']:>8} {r['copy_s']:>7.2f} {r['copy_mb']:>8} {r['build_s']:>8.1f} {r['load_s']:>7.2f} "
              f"{r['stall_s']:>8.2f} {r['p50']:>11.2f} {r['p99']:>6.2f} {r['load']:>9.1f}", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} at the end (search: the memory core's, no gRPC, one part)")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
