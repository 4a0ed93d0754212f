"""Index builds of the embedded store run in another process and lose nothing written meanwhile."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from agentmesh.memory.edge_store import EdgeStore
from agentmesh.memory.ports import FusionPlan, PointFilter, point_id

pytestmark = pytest.mark.slow

DIM = 8
PLAN = FusionPlan(fusion="weighted", prefetch_limit=20, rrf_k=5, dense_weight=0.1, sparse_weight=1.0)


def rows(start: int, n: int, rng: random.Random):
    out = []
    for i in range(start, start + n):
        payload = {"id": f"m{i}", "namespace": "ns", "text": f"memory {i}", "kind": "fact", "metadata": {},
                   "created_at": float(i), "updated_at": float(i), "source_session_id": ""}
        dense = [rng.random() for _ in range(DIM)]
        out.append((point_id("memory", "ns", f"m{i}"), dense, ([i + 1], [1.0]), payload))
    return out



async def write_and_search_while_building(store: EdgeStore, rng, written: int) -> tuple[int, int]:
    """While namespace "ns" is being indexed: write 5 points at a time and search for the last one
    (searches answer, and find what was just written, while the copy is indexed). Returns the
    points written and the searches answered."""
    answered = 0
    while store.memory_shard_stats("ns")["indexing"]:
        await store.upsert_memories("ns", rows(written, 5, rng))
        written += 5
        hits = await store.hybrid_search(PointFilter("ns"), [0.5] * DIM, ([written], [1.0]), 1, PLAN)
        assert hits[0][2]["id"] == f"m{written - 1}"
        answered += 1
        await asyncio.sleep(0.05)
    return written, answered

async def test_a_shard_is_indexed_off_process_while_reads_and_writes_go_on(tmp_path):
    rng = random.Random(1)
    store = EdgeStore(tmp_path / "home", index_after=300)
    await store.open()
    assert await store.check_embedder("e", DIM) == ""
    try:
        await store.upsert_memories("ns", rows(0, 299, rng))
        assert store.memory_shard_stats("ns")["indexing"] is False
        await store.upsert_memories("ns", rows(299, 1, rng))  # the 300th point starts a build
        assert store.memory_shard_stats("ns")["indexing"] is True

        written, answered = await write_and_search_while_building(store, rng, written=300)
        assert answered > 3, "the build finished before the test could search beside it"
        # On a slow machine 300 more points arrive during the build, and the next starts as it ends.
        builds = store.memory_shard_stats("ns")["builds"]
        assert builds >= 1
        current = json.loads((store.root / "memories" / "ns" / "CURRENT").read_text())
        assert current["generation"] == builds + 1 and 300 <= current["indexed_points"] < written
        assert sorted(p.name for p in (store.root / "memories" / "ns").glob("gen-*")) == [f"gen-{builds + 1:04d}"]
        # Everything written during the build made it into the indexed generation.
        assert await store.count_memories(PointFilter("ns")) == written
        found = await store.get_memories("ns", [point_id("memory", "ns", f"m{i}") for i in range(written)])
        assert len(found) == written
    finally:
        await store.close()

    reopened = EdgeStore(tmp_path / "home", index_after=300)
    await reopened.open()
    try:
        assert await reopened.check_embedder("e", DIM) == ""
        assert await reopened.count_memories(PointFilter("ns")) == written
    finally:
        await reopened.close()


async def test_a_build_interrupted_by_a_stop_leaves_the_current_generation_whole(tmp_path):
    rng = random.Random(2)
    store = EdgeStore(tmp_path / "home", index_after=100)
    await store.open()
    await store.check_embedder("e", DIM)
    await store.upsert_memories("ns", rows(0, 100, rng))
    assert store.memory_shard_stats("ns")["indexing"] is True
    await asyncio.sleep(0.3)  # the copy is made, the indexer process is starting
    await store.upsert_memories("ns", rows(100, 10, rng))
    await store.close()  # kills the indexer, drops its copy

    reopened = EdgeStore(tmp_path / "home", index_after=0)
    await reopened.open()
    try:
        await reopened.check_embedder("e", DIM)
        # Either the build was stopped (its copy gone) or it had finished and was swapped in:
        # one whole generation, the one CURRENT names, with every write.
        root = reopened.root / "memories" / "ns"
        generations = sorted(p.name for p in root.glob("gen-*"))
        assert generations in (["gen-0001"], ["gen-0002"])
        assert json.loads((root / "CURRENT").read_text())["generation"] == int(generations[0][4:])
        assert await reopened.count_memories(PointFilter("ns")) == 110
    finally:
        await reopened.close()


async def test_writes_do_not_wait_for_a_build_to_copy_the_shard(tmp_path):
    rng = random.Random(3)
    store = EdgeStore(tmp_path / "home", index_after=2000)
    await store.open()
    await store.check_embedder("e", DIM)
    try:
        await store.upsert_memories("ns", rows(0, 1999, rng))
        shard = store._memory_shard("ns", create=False).open_part  # noqa: SLF001 - the shard the build runs on
        await store.upsert_memories("ns", rows(1999, 1, rng))  # starts a build
        async with asyncio.timeout(10):
            while not shard.copying:
                await asyncio.sleep(0)
        written, during_copy = 2000, 0
        async with asyncio.timeout(60):
            while shard.copying:
                await store.upsert_memories("ns", rows(written, 1, rng))
                written += 1
                during_copy += shard.copying  # acknowledged while the copy still runs
                await asyncio.sleep(0.001)  # as between two requests: the build's steps get their turn
        assert during_copy > 0, "every write waited for the copy to finish"
        await store.wait_indexed()
        assert store.memory_shard_stats("ns")["builds"] == 1
        # Nothing written during the copy is missing from the indexed generation.
        found = await store.get_memories("ns", [point_id("memory", "ns", f"m{i}") for i in range(written)])
        assert len(found) == written == await store.count_memories(PointFilter("ns"))
    finally:
        await store.close()
    reopened = EdgeStore(tmp_path / "home", index_after=0)
    await reopened.open()
    try:
        await reopened.check_embedder("e", DIM)
        assert await reopened.count_memories(PointFilter("ns")) == written
    finally:
        await reopened.close()


async def test_writes_during_a_build_reach_the_indexed_copy_and_can_start_the_next_build(tmp_path):
    """Upserts of new and existing memories and deletes made while the copy is indexed are in
    the generation swapped in; and as many new memories as `index_after` start the next build
    when this one ends, without waiting for another write."""
    rng = random.Random(4)
    store = EdgeStore(tmp_path / "home", index_after=300)
    await store.open()
    await store.check_embedder("e", DIM)
    try:
        await store.upsert_memories("ns", rows(0, 299, rng))
        shard = store._memory_shard("ns", create=False).open_part  # noqa: SLF001 - the shard the build runs on
        await store.upsert_memories("ns", rows(299, 1, rng))  # starts a build
        async with asyncio.timeout(30):
            while not shard.copying:
                await asyncio.sleep(0)
            while shard.copying:
                await asyncio.sleep(0.01)
        assert store.memory_shard_stats("ns")["indexing"] is True, "the build ended before the test could write"
        # While the copy is being indexed: 320 new memories, 10 changed, 10 deleted.
        await store.upsert_memories("ns", rows(300, 320, rng))
        changed = rows(0, 10, rng)
        for _, _, _, payload in changed:
            payload["text"] += " (changed)"
        await store.upsert_memories("ns", changed)
        await store.delete_memories_by_ids("ns", [point_id("memory", "ns", f"m{i}") for i in range(10, 20)])
        await store.wait_indexed()
        assert store.memory_shard_stats("ns")["builds"] == 2
        current = json.loads((store.root / "memories" / "ns" / "CURRENT").read_text())
        assert current["generation"] == 3 and current["indexed_points"] >= 610
        found = await store.get_memories("ns", [point_id("memory", "ns", f"m{i}") for i in range(620)])
        assert len(found) == 610 == await store.count_memories(PointFilter("ns"))
        texts = {p["id"]: p["text"] for p in found.values()}
        assert all(texts[f"m{i}"].endswith("(changed)") for i in range(10))
        assert not any(f"m{i}" in texts for i in range(10, 20))
    finally:
        await store.close()


async def test_writes_wait_for_a_build_they_are_index_after_ahead_of(tmp_path):
    """A bulk import faster than index builds does not grow the unindexed segment without bound:
    once `index_after` writes arrived since the running build's copy, the next waits for the swap."""
    rng = random.Random(5)
    store = EdgeStore(tmp_path / "home", index_after=300)
    await store.open()
    await store.check_embedder("e", DIM)
    try:
        await store.upsert_memories("ns", rows(0, 300, rng))  # starts a build
        shard = store._memory_shard("ns", create=False).open_part  # noqa: SLF001 - the shard the build runs on
        async with asyncio.timeout(30):
            while not shard.copying:
                await asyncio.sleep(0)
            while shard.copying:
                await asyncio.sleep(0.01)
        await store.upsert_memories("ns", rows(300, 301, rng))  # admitted: nothing was ahead yet
        # The indexer is a Python process just started: it cannot have ended within the last
        # 10 ms poll and the write above, which never yields to the event loop.
        assert store.memory_shard_stats("ns")["builds"] == 0, "the build ended before the test could write"
        held = asyncio.create_task(store.upsert_memories("ns", rows(601, 1, rng)))
        builds_when_done: list[int] = []
        held.add_done_callback(lambda _: builds_when_done.append(store.memory_shard_stats("ns")["builds"]))
        async with asyncio.timeout(120):
            await held
        assert builds_when_done[0] >= 1, "a write 301 ahead of the build's copy did not wait for its swap"
        assert await store.count_memories(PointFilter("ns")) == 602
    finally:
        await store.close()


async def test_a_shard_a_bulk_import_left_unindexed_is_built_on_first_use(tmp_path):
    """A bulk import (builds off, as `benches.memory_scale --million` fills 1M) leaves a shard
    unindexed; the service opened on it afterwards starts the build at the first search rather
    than at a next write that may never come, and answers and takes writes while it runs."""
    rng = random.Random(6)
    bulk = EdgeStore(tmp_path / "home", index_after=0)
    await bulk.open()
    await bulk.check_embedder("e", DIM)
    await bulk.upsert_memories("ns", rows(0, 600, rng))
    assert bulk.memory_shard_stats("ns")["indexing"] is False
    await bulk.close()

    store = EdgeStore(tmp_path / "home", index_after=300)
    await store.open()
    assert await store.check_embedder("e", DIM) == ""
    try:
        hits = await store.hybrid_search(PointFilter("ns"), [0.5] * DIM, ([600], [1.0]), 1, PLAN)
        assert hits[0][2]["id"] == "m599"
        assert store.memory_shard_stats("ns")["indexing"] is True, "the first search did not start a build"
        written, answered = await write_and_search_while_building(store, rng, written=600)
        assert answered > 3, "the build finished before the test could search beside it"
        current = json.loads((store.root / "memories" / "ns" / "CURRENT").read_text())
        assert current["generation"] >= 2 and current["indexed_points"] >= 600
        found = await store.get_memories("ns", [point_id("memory", "ns", f"m{i}") for i in range(written)])
        assert len(found) == written == await store.count_memories(PointFilter("ns"))
    finally:
        await store.close()
