"""What the memory benches share: a synthetic corpus, its queries and a single-process BM25
baseline over it, and `agentmesh serve memory` as a process whose index builds are followed in its
log. (`benches.memory_scale` and `benches.memory_parts`; the underscore keeps `make bench` from
running it as a bench.)"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import random
import re
import signal
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

BATCH = 256  # memories per Import call


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
    # Cumulative once (the same draws as `weights`): choices() would re-add 20k weights per sentence.
    cumulative = list(itertools.accumulate(weights))
    return [" ".join(rng.choices(vocab, cum_weights=cumulative, k=rng.randint(8, 20))) for _ in range(n)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def ms(values: list[float], q: float | None = None) -> float:
    if not values:
        return float("nan")
    return (statistics.median(values) if q is None else percentile(values, q)) * 1000


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


def make_queries(texts: list[str], n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.sample(texts[rng.randrange(len(texts))].split(), 4)) for _ in range(n)]


class ServiceProcess:
    """`agentmesh serve memory` on its own home; follows its log for index builds."""

    def __init__(self, home: Path, env: dict[str, str]):
        self.env = {**os.environ, "AGENTMESH_HOME": str(home), "AGENTMESH_LISTEN_ADDR": "127.0.0.1:0",
                    "AGENTMESH_TRACES": "none", **env}
        self.proc: asyncio.subprocess.Process | None = None
        self.builds_started = 0
        self.builds_done = 0
        self.build_log: list[str] = []
        self.echo_builds = False
        self.building: set[str] = set()  # shards (and parts: "scale/part-0001") whose build has started and not ended

    async def start(self) -> str:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agentmesh.cli.main", "serve", "memory", env=self.env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, limit=1 << 20,
        )
        while True:
            line = (await self.proc.stdout.readline()).decode()
            if not line:
                raise RuntimeError("the memory service did not start")
            if "service started" in line:
                port = re.search(r'"port": (\d+)', line).group(1)
                asyncio.get_running_loop().create_task(self._follow())
                return f"127.0.0.1:{port}"

    async def _follow(self) -> None:
        while line := (await self.proc.stdout.readline()).decode():
            shard = re.search(r'"shard": "([^"]+)"', line)
            if '"memory shard indexing"' in line:
                self.builds_started += 1
                self.building.add(shard.group(1) if shard else "")
            elif '"memory shard indexed"' in line or "index build failed" in line:
                self.builds_done += 1
                self.build_log.append(line.strip())
                if self.echo_builds:  # as they end: a run the disk guard stops still shows them
                    print(f"{'':>11}{time.strftime('%H:%M:%S')}", end="")
                    print_build(line)
                self.building.discard(shard.group(1) if shard else "")

    def indexer_rss_mb(self) -> float:
        """Resident memory of the service's child processes (the index builder), MB."""
        total = 0.0
        try:
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
            for pid in children:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) / 1024
        except OSError:
            pass
        return total

    @property
    def indexing(self) -> bool:
        return self.builds_started > self.builds_done

    def building_namespace(self, namespace: str) -> bool:
        return any(name == namespace or name.startswith(f"{namespace}/") for name in self.building)

    async def namespace_built(self, namespace: str, grace_s: float = 3.0) -> bool:
        """No build of the namespace's parts runs, nor starts within `grace_s` (the parts' builds
        take turns, and the next starts as one ends)."""
        if self.building_namespace(namespace):
            return False
        await asyncio.sleep(grace_s)
        return not self.building_namespace(namespace)

    def rss_mb(self, field: str = "VmRSS") -> float:
        """Resident memory of the service, MB: VmRSS (all), RssAnon (heap), RssFile (mmap'd files)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    async def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        await self.proc.wait()


def print_build(line: str) -> None:
    found = dict(re.findall(r'"(shard|points|copy_s|load_s|swap_s|total_s)": "?([^,"]+)"?', line))
    print(f"  build of {found.get('shard')}: {found.get('points')} points, copy {found.get('copy_s')} s, "
          f"load of the indexed copy (the service stalls) {found.get('load_s')} s, "
          f"writes paused {found.get('swap_s')} s for the swap, {found.get('total_s')} s in all", flush=True)
