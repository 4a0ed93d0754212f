"""Long-term memory at scale on the embedded store: search and append latency, RSS, and searches
while indexes are being built; beside it, the old local mode and a single-process baseline.

    .venv/bin/python -m benches.memory_scale [--sizes 10000,100000] [--million] [--queries 200]
        [--layouts per-namespace,shared] [--local-sizes 2000,10000] [--local-budget-s 300]
        [--others N] [--fill-budget-s S] [--checkpoint-every N] [--build-budget-s S]
        [--million-through-rpc]

For each layout and size, the memory service runs as its own `agentmesh serve memory` process on
a fresh home (Qdrant Edge, hashing embedder). Two other namespaces get size/10 memories each, then
the measured namespace is filled with `size` synthetic memories (sentences over a 20k-word
vocabulary with a Zipf-like spread) through the Import RPC in batches of 256. Then:

- **during indexing**: Search RPCs back to back while the service builds indexes off-process
  (edge_shards.py), p50/p99/max; the service's log says when a build starts and ends;
- **steady**: Search RPC p50/p99 (k=10, 4-6 words drawn from a stored memory) once no build runs;
- **RSS** of the service process at that point, and of it the anonymous part (heap: what the
  kernel cannot page out; the rest is mmap'd files, which it can); **AppendMessages** RPC p50;
- **along the fill** (every --checkpoint-every memories): the fill rate so far, RSS, anonymous
  RSS, and Search p50/p99 over 50 queries at that size — so a fill that --fill-budget-s cuts
  short (the 1M run on a small machine) still reports the largest size it reached.

`--million` brings one namespace to 1,000,000 memories the way a bulk import does (and two
others to --others, default 20,000): a child process under `nice 10` writes them through the
memory core and the Edge store adapter that `agentmesh memory migrate` uses, with index builds
off (`index_after=0`); then `agentmesh serve memory` opens that home with default settings, the
first Search starts the namespace's one index build, and the bench searches once every 2 s while
it runs (brute force over the unindexed namespace, then the swap), with the service's and the
builder's RSS; after it (or after --build-budget-s), Search p50/p99 over --queries, RSS split into
anonymous (heap) and file-backed (mmap'd), AppendMessages RPC p50. `--million-through-rpc` fills
1M through the Import RPC with builds as it goes instead (the fill's pace is the builder's).

Beside it, in this process: AppendMessages through the transcripts core on Edge and on local mode
(what the service does inside, without gRPC); local mode's hybrid search at the sizes it can
fill within --local-budget-s; and the baseline a single-process server would have: the same
memories in Python lists, BM25 by a loop over an inverted index, the same queries.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from agentmesh.clients.memory import MemoryClient
from agentmesh.internal.v1 import memory_service_pb2
from agentmesh.memory.edge_store import EdgeStore
from agentmesh.memory.embedders import HashingEmbedder
from agentmesh.memory.memories import Memories
from agentmesh.memory.memory_records import RememberItem
from agentmesh.memory.qdrant_store import QdrantStore
from agentmesh.memory.settings import MemorySettings
from agentmesh.memory.transcript_records import SessionRecord, TranscriptMessage
from agentmesh.memory.transcripts import Transcripts
from agentmesh.v1 import common_pb2
from benches._memory_fixtures import BATCH, ServiceProcess, baseline_bm25, make_queries, ms, print_build, sentences
from tests.support.identities import signed_channel


async def fill(client: MemoryClient, namespace: str, texts: list[str], budget_s: float | None = None,
               checkpoint=None, every: int = 0) -> tuple[float, int]:
    """Import `texts` in batches; stop after `budget_s`. Returns (memories/s, memories stored)."""
    started, stored, next_checkpoint = time.perf_counter(), 0, every
    for start in range(0, len(texts), BATCH):
        batch = [memory_service_pb2.RememberRequest(text=t, kind="knowledge") for t in texts[start : start + BATCH]]
        await client.import_memories(batch, namespace=namespace)
        stored += len(batch)
        if checkpoint is not None and every and stored >= next_checkpoint:
            await checkpoint(stored, stored / (time.perf_counter() - started))
            next_checkpoint += every
        if budget_s is not None and time.perf_counter() - started > budget_s:
            break
    return stored / (time.perf_counter() - started), stored


async def timed_searches(client: MemoryClient, queries: list[str]) -> list[float]:
    out = []
    for query in queries:
        q = time.perf_counter()
        await client.search(query, namespace="scale", k=10)
        out.append(time.perf_counter() - q)
    return out


async def run_edge(size: int, layout: str, n_queries: int, texts: list[str], others_size: int | None = None,
                   fill_budget_s: float | None = None, checkpoint_every: int = 0) -> dict:
    others = sentences(size // 10 if others_size is None else others_size, seed=size + 1)
    queries = make_queries(texts, n_queries, size)
    with tempfile.TemporaryDirectory() as home:
        service = ServiceProcess(Path(home), {"AGENTMESH_MEMORY_LAYOUT": layout})
        target = await service.start()
        # The memory service takes transcript writes from the agent only: the bench signs as it.
        channel = signed_channel(Path(home) / "keys", "agent", "memory", target)
        client = MemoryClient(channel, target=target, timeout_s=120)
        try:
            for other in ("other-a", "other-b"):
                await fill(client, other, others)

            async def checkpoint(stored: int, rate: float) -> None:
                lat = await timed_searches(client, make_queries(texts[:stored], 50, stored))
                print(f"{'':>13}   {stored:>9} memories, {rate:.0f}/s so far, RSS {service.rss_mb():.0f} MB "
                      f"(anonymous {service.rss_mb('RssAnon'):.0f}), Search p50 {ms(lat):.2f} / p99 {ms(lat, 0.99):.2f} ms"
                      f"{', index build running' if service.indexing else ''}, load average {os.getloadavg()[0]:.1f}",
                      flush=True)

            ingest, stored = await fill(client, "scale", texts, fill_budget_s, checkpoint, checkpoint_every)
            queries = make_queries(texts[:stored], n_queries, size)
            # Searches while indexes are built (if a build runs now), for at least a few seconds.
            during, t0, i = [], time.perf_counter(), 0
            while service.indexing or (during and time.perf_counter() - t0 < 3):
                q = time.perf_counter()
                await client.search(queries[i % len(queries)], namespace="scale", k=10)
                during.append(time.perf_counter() - q)
                i += 1
                await asyncio.sleep(0.05)  # a steady ~15 searches/s, not a flood that starves the build
            while service.indexing:
                await asyncio.sleep(0.5)
            for query in queries[:20]:  # warm
                await client.search(query, namespace="scale", k=10)
            steady = await timed_searches(client, queries)
            rss, rss_anon = service.rss_mb(), service.rss_mb("RssAnon")
            await client.put_session("bench")
            appends = []
            for n in range(300):
                q = time.perf_counter()
                await client.append_messages("bench", [common_pb2.Message(role="user", content=f"message {n} " * 8)])
                appends.append(time.perf_counter() - q)
        finally:
            await channel.close()
            await service.stop()
    return {"layout": layout, "size": stored, "ingest": ingest, "rss_anon": rss_anon, "p50": ms(steady), "p99": ms(steady, 0.99),
            "during_n": len(during) if service.builds_done else 0, "during_p50": ms(during), "during_p99": ms(during, 0.99),
            "during_max": max(during, default=float("nan")) * 1000, "rss": rss, "append_rpc": ms(appends),
            "builds": service.builds_done, "queries": queries, "build_log": service.build_log}


async def bulk_fill(home: Path, size: int, others_size: int, part_size: int) -> None:
    """Fill a home the way a bulk import does: through the memory core and the Edge store adapter
    that `agentmesh memory migrate` writes with, index builds off (a service opened on the home
    afterwards builds each shard once). Runs in a child process under `nice`."""
    settings = MemorySettings()
    store = EdgeStore(home, layout="per-namespace", index_after=0, part_size=part_size)
    await store.open()
    memories = Memories(store, HashingEmbedder(settings.hashing_dim), settings)
    try:
        await memories.open()
        for namespace, texts in (("other-a", sentences(others_size, seed=size + 1)),
                                 ("other-b", sentences(others_size, seed=size + 2)), ("scale", sentences(size))):
            started = time.perf_counter()
            for start in range(0, len(texts), BATCH):
                batch = [RememberItem(namespace=namespace, text=t, kind="knowledge") for t in texts[start : start + BATCH]]
                await memories.import_many(namespace, batch)
                done = start + len(batch)
                if done % 100_000 < BATCH or done == len(texts):
                    print(f"{'':>13}   bulk import {namespace}: {done} memories, {done / (time.perf_counter() - started):.0f}/s, "
                          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        await store.close()


async def searches_beside_build(service: ServiceProcess, client: MemoryClient, queries: list[str], every_s: float,
                                budget_s: float, out: dict, key: str) -> None:
    """Search once every `every_s` while the namespace's build runs: (seconds into it, latency)."""
    build_started = time.perf_counter()
    during: list[tuple[float, float]] = []
    indexer_rss = rss_peak = anon_peak = disk_peak = 0.0
    scale_dir = Path(service.env["AGENTMESH_HOME"]) / "memory" / "memories" / "scale"
    checked_disk = 0.0
    while (not await service.namespace_built("scale", 0.0) or not await service.namespace_built("scale")) \
            and time.perf_counter() - build_started < budget_s:
        free_gb = shutil.disk_usage(service.env["AGENTMESH_HOME"]).free / 2**30
        if free_gb < 1.5:  # a build copies the part it indexes; do not fill a shared disk
            raise RuntimeError(f"{free_gb:.1f} GB left on the disk during the build: stopping the bench")
        if time.perf_counter() - checked_disk > 10:  # the namespace's directory with a build's copy in it
            checked_disk = time.perf_counter()
            du = await asyncio.create_subprocess_exec("du", "-sm", str(scale_dir), stdout=asyncio.subprocess.PIPE)
            disk_peak = max(disk_peak, int((await du.communicate())[0].split()[0] or 0))
        q = time.perf_counter()
        await client.search(queries[len(during) % len(queries)], namespace="scale", k=10)
        during.append((q - build_started, time.perf_counter() - q))
        indexer_rss = max(indexer_rss, service.indexer_rss_mb())
        rss_peak, anon_peak = max(rss_peak, service.rss_mb()), max(anon_peak, service.rss_mb("RssAnon"))
        if len(during) % 150 == 0:
            lat = [d for _, d in during[-150:]]
            print(f"{'':>13}   build running {time.perf_counter() - build_started:.0f} s: last 150 searches p50 "
                  f"{ms(lat):.0f} / max {max(lat) * 1000:.0f} ms, service RSS {service.rss_mb():.0f} MB, "
                  f"builder RSS {service.indexer_rss_mb():.0f} MB, load average {os.getloadavg()[0]:.1f}", flush=True)
        await asyncio.sleep(every_s)
    out[key] = {"built": not service.building_namespace("scale"), "build_s": time.perf_counter() - build_started,
                "during": during, "indexer_rss": indexer_rss, "rss_peak": rss_peak, "anon_peak": anon_peak,
                "disk_peak_mb": disk_peak}


async def run_bulk(size: int, n_queries: int, others_size: int, build_budget_s: float, keep_home: str = "",
                   grow: int = 0, part_size: int = 0, every_s: float = 2.0) -> dict:
    """`size` memories brought in by a bulk import (bulk_fill, under nice), then the service on that
    home builds the namespace's indexes once while Search RPCs run beside the build. `keep_home`:
    fill (or reuse, if filled) that home instead of a temporary one. `grow`: then import that many
    more through the Import RPC, which starts one ordinary build of the large namespace."""
    out: dict = {"size": size, "others": others_size, "part_size": part_size, "every_s": every_s}
    with tempfile.TemporaryDirectory() as tmp:
        home = keep_home or tmp
        started = time.perf_counter()
        texts = sentences(size)  # the filler draws the same memories
        queries = make_queries(texts, n_queries, size)
        if (Path(home) / "memory" / "memories" / "scale" / "meta.json").exists():
            out["fill_s"] = 0.0  # reused
        else:
            filler = await asyncio.create_subprocess_exec(
                "nice", "-n", "10", sys.executable, "-m", "benches.memory_scale", "--bulk-fill", home,
                "--bulk-size", str(size), "--others", str(others_size), "--part-size", str(part_size))
            if await filler.wait() != 0:
                raise RuntimeError("the bulk import failed")
            out["fill_s"] = time.perf_counter() - started
        du = await asyncio.create_subprocess_exec("du", "-sm", str(Path(home) / "memory" / "memories" / "scale"),
                                                  stdout=asyncio.subprocess.PIPE)
        out["disk_mb_before"] = int((await du.communicate())[0].split()[0])

        service = ServiceProcess(Path(home), {"AGENTMESH_MEMORY_LAYOUT": "per-namespace",
                                              "AGENTMESH_MEMORY_PART_SIZE": str(part_size)})
        service.echo_builds = True
        target = await service.start()
        channel = signed_channel(Path(home) / "keys", "agent", "memory", target)
        client = MemoryClient(channel, target=target, timeout_s=600)
        try:
            # The first search opens the namespace's shard (loading 1M unindexed points) and
            # starts its build; the other namespaces are opened too, as a busy service would have.
            q = time.perf_counter()
            await client.search(queries[0], namespace="scale", k=10)
            out["first_search_s"] = time.perf_counter() - q
            for other in ("other-a", "other-b"):
                await client.search(queries[0], namespace=other, k=10)
            waited = time.perf_counter()
            while not service.building_namespace("scale") and time.perf_counter() - waited < 15:
                await asyncio.sleep(0.1)  # no build within 15 s: a reused home, indexed already
            # Searches while the build runs: one every 2 s, so that the searches (brute force over
            # the unindexed namespace until the swap) do not take the builder's CPU.
            await searches_beside_build(service, client, queries, every_s, build_budget_s, out, "first_build")
            out.update(out["first_build"])
            out["build_log"] = list(service.build_log)
            await asyncio.sleep(1.0)  # the old generation closes and is deleted
            for query in queries[:20]:  # warm
                await client.search(query, namespace="scale", k=10)
            steady = await timed_searches(client, queries)
            out["p50"], out["p99"] = ms(steady), ms(steady, 0.99)
            out["rss"], out["rss_anon"], out["rss_file"] = service.rss_mb(), service.rss_mb("RssAnon"), service.rss_mb("RssFile")
            out["load"] = os.getloadavg()[0]
            await client.put_session("bench")
            appends = []
            for n in range(300):
                q = time.perf_counter()
                await client.append_messages("bench", [common_pb2.Message(role="user", content=f"message {n} " * 8)])
                appends.append(time.perf_counter() - q)
            out["append_rpc"] = ms(appends)
            du = await asyncio.create_subprocess_exec("du", "-sm", str(Path(home) / "memory" / "memories" / "scale"),
                                                      stdout=asyncio.subprocess.PIPE)
            out["disk_mb_after"] = int((await du.communicate())[0].split()[0])
            if grow:
                # The large namespace keeps growing the ordinary way: `grow` more through Import,
                # which starts one build of it (a copy of the whole shard, then a swap).
                logged = len(service.build_log)
                q = time.perf_counter()
                await fill(client, "scale", sentences(grow, seed=size + 3))
                out["grow_s"] = time.perf_counter() - q
                waited = time.perf_counter()
                while not service.building_namespace("scale") and time.perf_counter() - waited < 30:
                    await asyncio.sleep(0.1)
                await searches_beside_build(service, client, queries, 0.25, min(build_budget_s, 600), out, "grow_build")
                out["grow_log"] = service.build_log[logged:]
                await asyncio.sleep(1.0)
                after = await timed_searches(client, queries)
                out["grow_p50"], out["grow_p99"] = ms(after), ms(after, 0.99)
                out["grow_rss"], out["grow_anon"] = service.rss_mb(), service.rss_mb("RssAnon")
        finally:
            await channel.close()
            await service.stop()
    out["baseline"] = baseline_bm25(texts, queries[:50])  # 50: a Python loop over 1M memories is slow
    return out


def print_bulk(r: dict) -> None:
    during = [d for _, d in r["during"]]
    print(f"\nQdrant Edge, {r['size']:,} memories by bulk import (+2 x {r['others']:,} in other namespaces), "
          f"Search through gRPC to `agentmesh serve memory`:")
    fill = f"{r['fill_s']:.0f} s, {r['size'] / r['fill_s']:.0f}/s" if r["fill_s"] else "reused from --home"
    print(f"  bulk import (nice 10): {fill}; namespace on disk {r['disk_mb_before']} MB; "
          f"parts of {r['part_size'] or 'unbounded'}")
    print(f"  first Search (opens the unindexed shard, starts its build): {r['first_search_s'] * 1000:.0f} ms")
    print(f"  index builds: {'done' if r['built'] else 'NOT done'} after {r['build_s']:.0f} s; builder RSS up to "
          f"{r['indexer_rss']:.0f} MB; service RSS up to {r['rss_peak']:.0f} MB ({r['anon_peak']:.0f} anonymous); "
          f"namespace on disk up to {r['disk_peak_mb']} MB during them")
    if during:
        worst = sorted(r["during"], key=lambda td: -td[1])[:3]
        print(f"  Search while they ran (1 every {r['every_s']} s): n {len(during)}, p50 {ms(during):.1f} / p99 {ms(during, 0.99):.1f} / "
              f"max {max(during) * 1000:.0f} ms; slowest at " + ", ".join(f"{t:.0f} s ({d * 1000:.0f} ms)" for t, d in worst))
    for line in r["build_log"]:
        print_build(line)
    print(f"  after the build: Search p50 {r['p50']:.2f} / p99 {r['p99']:.2f} ms; service RSS {r['rss']:.0f} MB "
          f"(anonymous {r['rss_anon']:.0f}, file-backed {r['rss_file']:.0f}); AppendMessages RPC p50 {r['append_rpc']:.3f} ms; "
          f"shard on disk {r['disk_mb_after']} MB; load average {r['load']:.1f}")
    if "grow_build" in r:
        g = r["grow_build"]
        during = [d for _, d in g["during"]]
        print(f"  then {r['grow_s']:.0f} s to import more through the Import RPC; its build "
              f"{'done' if g['built'] else 'NOT done'} after {g['build_s']:.0f} s")
        for line in r["grow_log"]:
            print_build(line)
        if during:
            worst = sorted(g["during"], key=lambda td: -td[1])[:3]
            print(f"  Search while it ran (4 a second): n {len(during)}, p50 {ms(during):.1f} / p99 {ms(during, 0.99):.1f} / "
                  f"max {max(during) * 1000:.0f} ms; slowest at " + ", ".join(f"{t:.0f} s ({d * 1000:.0f} ms)" for t, d in worst))
        print(f"  after it: Search p50 {r['grow_p50']:.2f} / p99 {r['grow_p99']:.2f} ms; service RSS {r['grow_rss']:.0f} MB "
              f"(anonymous {r['grow_anon']:.0f})")
    print(f"  single-process baseline (Python BM25, same memories, 50 of the queries): p50 {ms(r['baseline']):.1f} / "
          f"p99 {ms(r['baseline'], 0.99):.1f} ms", flush=True)


async def core_appends(store, n: int = 500) -> float:
    await store.open()
    try:
        transcripts = Transcripts(store, MemorySettings())
        await transcripts.put_session(SessionRecord("bench"))
        times = []
        for i in range(n):
            q = time.perf_counter()
            await transcripts.append_messages("bench", [TranscriptMessage(role="user", content=f"message {i} " * 8)])
            times.append(time.perf_counter() - q)
        return ms(times)
    finally:
        await store.close()


async def run_local(size: int, n_queries: int, budget_s: float, texts: list[str]) -> dict:
    settings = MemorySettings()
    with tempfile.TemporaryDirectory() as home:
        store = QdrantStore.connect(path=Path(home) / "qdrant", layout="per-namespace")
        await store.open()
        memories = Memories(store, HashingEmbedder(settings.hashing_dim), settings)
        try:
            await memories.open()
            started, stored = time.perf_counter(), 0
            for start in range(0, size, BATCH):
                batch = [RememberItem(namespace="scale", text=t, kind="knowledge") for t in texts[start : start + BATCH]]
                stored += await memories.import_many("scale", batch)
                if time.perf_counter() - started > budget_s:
                    break
            ingest = stored / (time.perf_counter() - started)
            latencies = []
            for query in make_queries(texts[:stored], n_queries, size):
                q = time.perf_counter()
                await memories.search("scale", query, 10)
                latencies.append(time.perf_counter() - q)
        finally:
            await store.close()
    return {"size": size, "stored": stored, "ingest": ingest, "p50": ms(latencies), "p99": ms(latencies, 0.99),
            "queries": len(latencies)}


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benches.memory_scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--million", action="store_true",
                        help="also 1,000,000 memories brought in by a bulk import, then indexed once by the service (slow)")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--layouts", default="per-namespace,shared")
    parser.add_argument("--local-sizes", default="2000,10000")
    parser.add_argument("--local-budget-s", type=float, default=300.0, help="stop filling local mode after this long")
    parser.add_argument("--others", type=int, default=None, help="memories in each of the two other namespaces (default size/10)")
    parser.add_argument("--fill-budget-s", type=float, default=None,
                        help="stop filling the measured namespace after this long and measure at the size reached")
    parser.add_argument("--checkpoint-every", type=int, default=0,
                        help="every N memories of the fill: rate, RSS and 50 searches (default: 100000 with --million)")
    parser.add_argument("--million-through-rpc", action="store_true",
                        help="fill 1,000,000 through the Import RPC with builds as it goes (the 2026-11-24 run)")
    parser.add_argument("--build-budget-s", type=float, default=5400.0,
                        help="--million: measure after this long even if the build has not finished")
    parser.add_argument("--home", default="", help="--million: fill this home and keep it, or reuse it if filled")
    parser.add_argument("--grow", type=int, default=0,
                        help="--million: then import N more through the Import RPC and measure that build")
    parser.add_argument("--part-size", type=int, default=MemorySettings().part_size,
                        help="--million: AGENTMESH_MEMORY_PART_SIZE of the import and the service (0: one part)")
    parser.add_argument("--every-s", type=float, default=2.0,
                        help="--million: one Search every this many seconds while the first builds run")
    parser.add_argument("--bulk-fill", default="", help=argparse.SUPPRESS)  # the --million child process
    parser.add_argument("--bulk-size", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.bulk_fill:
        await bulk_fill(Path(args.bulk_fill), args.bulk_size, args.others or 0, args.part_size)
        return 0
    sizes = [int(s) for s in args.sizes.split(",") if s] + ([1_000_000] if args.million_through_rpc else [])
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start", flush=True)

    print("\nQdrant Edge, Search / AppendMessages through gRPC to `agentmesh serve memory`:")
    print(f"{'layout':>13} {'memories':>9} {'ingest/s':>9} {'search p50':>11} {'p99':>7} {'while indexing p50':>19} "
          f"{'p99':>7} {'max':>7} {'n':>5} {'builds':>6} {'RSS MB':>7} {'anon MB':>8} {'append p50':>11}  (ms)")
    baselines = {}
    for layout in [l for l in args.layouts.split(",") if l]:
        for size in sizes:
            texts = sentences(size)
            every = args.checkpoint_every or (100_000 if size >= 1_000_000 else 0)
            r = await run_edge(size, layout, args.queries, texts, args.others, args.fill_budget_s, every)
            print(f"{layout:>13} {r['size']:>9} {r['ingest']:>9.0f} {r['p50']:>11.2f} {r['p99']:>7.2f} {r['during_p50']:>19.2f} "
                  f"{r['during_p99']:>7.2f} {r['during_max']:>7.1f} {r['during_n']:>5} {r['builds']:>6} {r['rss']:>7.0f} {r['rss_anon']:>8.0f} "
                  f"{r['append_rpc']:>11.3f}", flush=True)
            for line in r["build_log"]:
                found = dict(re.findall(r'"(shard|points|copy_s|swap_s|total_s|writes_held_s)": "?([^,"]+)"?', line))
                print(f"{'':>13}   index build: shard {found.get('shard')}, {found.get('points')} points, "
                      f"copied in {found.get('copy_s')} s (writes go on), writes paused {found.get('swap_s')} s for the swap, "
                      f"{found.get('total_s')} s in all; writes held back for builds {found.get('writes_held_s')} s so far",
                      flush=True)
            if r["size"] not in baselines:
                base = baseline_bm25(texts[: r["size"]], r["queries"])
                baselines[r["size"]] = (ms(base), ms(base, 0.99))

    if args.million:
        print_bulk(await run_bulk(args.bulk_size or 1_000_000, args.queries, 20_000 if args.others is None else args.others,
                                  args.build_budget_s, args.home, args.grow, args.part_size, args.every_s))

    print("\nAppendMessages inside the service (transcripts core + store, no gRPC), p50 ms:")
    with tempfile.TemporaryDirectory() as home:
        edge = await core_appends(EdgeStore(Path(home)))
        local = await core_appends(QdrantStore.connect(path=Path(home) / "qdrant", layout="per-namespace"))
    print(f"  Qdrant Edge {edge:.3f}   local mode {local:.3f}", flush=True)

    print("\nlocal mode (the old embedded store), search through the core in this process, no gRPC:")
    print(f"{'memories':>9} {'stored':>7} {'ingest/s':>9} {'search p50':>11} {'p99':>7} {'queries':>8}  (ms)")
    for size in (int(s) for s in args.local_sizes.split(",") if s):
        r = await run_local(size, max(10, args.queries // 10), args.local_budget_s, sentences(size))
        print(f"{r['size']:>9} {r['stored']:>7} {r['ingest']:>9.0f} {r['p50']:>11.1f} {r['p99']:>7.1f} {r['queries']:>8}",
              flush=True)

    print("\nsingle-process baseline (Python BM25 over an inverted index, same queries):")
    for size, (p50, p99) in baselines.items():
        print(f"{size:>9} memories: p50 {p50:.2f} ms, p99 {p99:.2f} ms")
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
