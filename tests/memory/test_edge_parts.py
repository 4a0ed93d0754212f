"""A namespace in bounded parts (edge_parts.py): memories past AGENTMESH_MEMORY_PART_SIZE go to a
new part, and every read, update and delete still sees the namespace as one."""

from __future__ import annotations

import asyncio
import json
import random
import uuid

import pytest

from agentmesh.memory.edge_store import EdgeStore
from agentmesh.memory.ports import DENSE, SPARSE, FusionPlan, PointFilter, point_id
from tests.memory.conftest import MemoryService

DIM = 8
PLAN = FusionPlan(fusion="weighted", prefetch_limit=20, rrf_k=5, dense_weight=0.1, sparse_weight=1.0)


def dense_of(i: int) -> list[float]:
    rng = random.Random(i)
    return [rng.uniform(-1, 1) for _ in range(DIM)]


def row(i: int, text: str = "", kind: str = "fact", term: int | None = None):
    """Memory m<i>: its own dense vector and its own word (term 1000 + i), and a word all share (1)."""
    payload = {"id": f"m{i}", "namespace": "ns", "text": text or f"memory {i}", "kind": kind, "metadata": {},
               "created_at": float(i), "updated_at": float(i), "source_session_id": ""}
    own = 1000 + i if term is None else term
    return (point_id("memory", "ns", f"m{i}"), dense_of(i), ([1, own], [1.0, 1.0]), payload)


async def opened(home, **kwargs) -> EdgeStore:
    store = EdgeStore(home, **kwargs)
    await store.open()
    assert await store.check_embedder("e", DIM) == ""
    return store


async def write_one_by_one(store: EdgeStore, n: int) -> None:
    for i in range(n):
        await store.upsert_memories("ns", [row(i)])


async def top_id(store: EdgeStore, dense: list[float], terms: list[int]) -> str:
    hits = await store.hybrid_search(PointFilter("ns"), dense, (terms, [1.0] * len(terms)), 1, PLAN)
    return hits[0][2]["id"] if hits else ""


async def test_a_namespace_past_its_part_size_is_split_and_searched_in_every_part(tmp_path):
    store = await opened(tmp_path / "home", part_size=4, index_after=0)
    try:
        await write_one_by_one(store, 10)
        stats = store.memory_shard_stats("ns")
        assert stats["parts"] == 3 and stats["part_points"] == [4, 4, 2]
        root = store.root / "memories" / "ns"
        assert sorted(p.name for p in root.glob("part-*")) == ["part-0001", "part-0002"]
        for i in range(10):  # sealed parts (m0-m7) and the open one (m8, m9), by each retriever
            assert await top_id(store, dense_of(i), [1000 + i]) == f"m{i}"
            assert await top_id(store, [0.0] * DIM, [1000 + i]) == f"m{i}"
            assert await top_id(store, dense_of(i), []) == f"m{i}"
        assert await store.count_memories(PointFilter("ns")) == 10
        hits = await store.hybrid_search(PointFilter("ns"), dense_of(3), ([1], [1.0]), 10, PLAN)
        assert sorted(h[2]["id"] for h in hits) == sorted(f"m{i}" for i in range(10))
        ranked = await store.ranked(PointFilter("ns"), dense_of(9), DENSE, 3)
        assert ranked[0][2]["id"] == "m9" and ranked[0][1] >= ranked[1][1] >= ranked[2][1]
    finally:
        await store.close()


@pytest.mark.parametrize("plan", [
    PLAN,
    FusionPlan(fusion="rrf", prefetch_limit=20, rrf_k=60),
    FusionPlan(fusion="weighted", prefetch_limit=15, rrf_k=2, dense_weight=3.0, sparse_weight=0.5),
    FusionPlan(fusion="dbsf", prefetch_limit=20),
])
async def test_the_fusion_across_parts_scores_as_edge_fuses_within_one(tmp_path, plan):
    """Edge's own fused query over one part is the reference for `fuse` (used across parts)."""
    from agentmesh.memory.edge_parts import fuse

    store = await opened(tmp_path / "home", index_after=0)
    rng = random.Random(5)
    try:
        await store.upsert_memories("ns", [
            (pid, dense, ([1, 1000 + rng.randrange(8), 2000 + rng.randrange(4)], [1.0, 1.0, 1.0]), payload)
            for pid, dense, _, payload in (row(i) for i in range(40))
        ])
        for q in range(6):
            dense, sparse = dense_of(100 + q), ([1000 + q, 2000 + q % 4], [1.0, 1.0])
            edge = await store.hybrid_search(PointFilter("ns"), dense, sparse, 10, plan)
            lists = [await store.ranked(PointFilter("ns"), dense, DENSE, plan.prefetch_limit),
                     await store.ranked(PointFilter("ns"), sparse, SPARSE, plan.prefetch_limit)]
            ours = fuse(lists, plan, 10)
            # The same scores in the same order; points tied on a score may come in either order.
            assert [round(s, 5) for _, s, _ in ours] == [round(s, 5) for _, s, _ in edge]
            by_score = lambda rows: sorted((round(s, 5), pid) for pid, s, _ in rows)  # noqa: E731
            cut = round(edge[-1][1], 5)  # the last score may be tied with points beyond the limit
            assert [x for x in by_score(ours) if x[0] > cut] == [x for x in by_score(edge) if x[0] > cut]
    finally:
        await store.close()


async def test_an_update_or_a_delete_of_a_memory_in_a_sealed_part_reaches_that_part(tmp_path):
    store = await opened(tmp_path / "home", part_size=4, index_after=0)
    try:
        await write_one_by_one(store, 10)
        # m1 lives in the first (sealed) part: its update replaces it there, not beside it in the open part.
        await store.upsert_memories("ns", [row(1, text="memory 1, rewritten", term=5000)])
        assert store.memory_shard_stats("ns")["part_points"] == [4, 4, 2]
        assert await store.count_memories(PointFilter("ns")) == 10
        found = await store.get_memories("ns", [point_id("memory", "ns", "m1")])
        assert [p["text"] for p in found.values()] == ["memory 1, rewritten"]
        assert await top_id(store, [0.0] * DIM, [5000]) == "m1"
        assert await store.ranked(PointFilter("ns"), ([1001], [1.0]), SPARSE, 5) == []  # its old word is gone
        # A batch that updates memories of several parts and adds new ones.
        await store.upsert_memories("ns", [row(2, text="two again"), row(6, text="six again"), row(10)])
        assert store.memory_shard_stats("ns")["part_points"] == [4, 4, 3]
        found = await store.get_memories("ns", [point_id("memory", "ns", f"m{i}") for i in (2, 6, 10)])
        assert sorted(p["text"] for p in found.values()) == ["memory 10", "six again", "two again"]

        await store.delete_memories_by_ids("ns", [point_id("memory", "ns", "m5"), point_id("memory", "ns", "m9")])
        assert store.memory_shard_stats("ns")["part_points"] == [4, 3, 2]
        assert await store.get_memories("ns", [point_id("memory", "ns", "m5")]) == {}
        assert await store.ranked(PointFilter("ns"), ([1005], [1.0]), SPARSE, 5) == []

        await store.upsert_memories("ns", [row(3, kind="episode"), row(7, kind="episode")])
        assert await store.delete_memories_by_filter(PointFilter("ns", kinds=("episode",))) == 2
        assert store.memory_shard_stats("ns")["part_points"] == [3, 2, 2]

        assert await store.delete_memories_by_filter(PointFilter("ns")) == 7  # Forget all: the parts go
        assert not (store.root / "memories" / "ns").exists()
        assert await store.count_memories(PointFilter("ns")) == 0
    finally:
        await store.close()


async def test_a_scroll_pages_through_every_part_once_in_id_order(tmp_path):
    store = await opened(tmp_path / "home", part_size=4, index_after=0)
    try:
        await write_one_by_one(store, 10)
        await store.upsert_memories("ns", [row(4, kind="episode"), row(8, kind="episode"), row(9, kind="episode")])
        for f, expected in ((PointFilter("ns"), 10), (PointFilter("ns", kinds=("episode",)), 3)):
            seen, offset, pages = [], None, 0
            while True:
                page, offset = await store.scroll_memories(f, 3, offset)
                seen += [pid for pid, _ in page]
                pages += 1
                if not offset:
                    break
            assert len(seen) == expected == len(set(seen))
            assert seen == sorted(seen, key=lambda pid: uuid.UUID(pid).int)
            assert pages == -(-expected // 3)
        before, inside, after = await store.stream_window(PointFilter("ns"), 3.5, 6.5, edge=2)
        assert [p["id"] for _, p in before] == ["m3", "m2"]
        assert sorted(p["id"] for _, p in inside) == ["m4", "m5", "m6"]
        assert [p["id"] for _, p in after] == ["m7", "m8"]
    finally:
        await store.close()


async def test_parts_outlive_a_restart_and_new_memories_go_on_in_the_open_part(tmp_path):
    home = tmp_path / "home"
    store = await opened(home, part_size=4, index_after=0)
    await write_one_by_one(store, 6)
    await store.close()
    root = home / "memory" / "memories" / "ns"
    (root / "part-0009" / "gen-0001").mkdir(parents=True)  # a crash while making a part: no CURRENT yet

    store = await opened(home, part_size=4, index_after=0)
    try:
        assert store.memory_shard_stats("ns")["part_points"] == [4, 2]
        assert not (root / "part-0009").exists()
        for i in range(6, 11):
            await store.upsert_memories("ns", [row(i)])
        assert store.memory_shard_stats("ns")["part_points"] == [4, 4, 3]
        for i in (0, 5, 10):
            assert await top_id(store, dense_of(i), [1000 + i]) == f"m{i}"
    finally:
        await store.close()

    # A home whose part size is set back to 0 (one part) reads every part, and writes to the last.
    store = await opened(home, part_size=0, index_after=0)
    try:
        await store.upsert_memories("ns", [row(i) for i in range(11, 16)])
        assert store.memory_shard_stats("ns")["part_points"] == [4, 4, 8]
        assert await store.count_memories(PointFilter("ns")) == 16
    finally:
        await store.close()


@pytest.mark.slow
async def test_a_sealed_part_gets_its_last_build_and_builds_take_turns(tmp_path):
    store = await opened(tmp_path / "home", part_size=150, index_after=100)
    most_at_once = 0

    async def watch() -> None:
        nonlocal most_at_once
        while True:
            parts = store._memories["ns"].parts  # noqa: SLF001 - which parts run an indexer
            most_at_once = max(most_at_once, sum(1 for p in parts if p._process is not None))  # noqa: SLF001
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch())
    try:
        await store.upsert_memories("ns", [row(i) for i in range(100)])  # index_after reached: a build
        await store.wait_indexed()
        await store.upsert_memories("ns", [row(i) for i in range(100, 150)])  # 50 behind it: no build
        assert not store.memory_shard_stats("ns")["indexing"]
        for start in range(150, 310, 10):  # seals the first part (its last build), fills the second, seals it
            await store.upsert_memories("ns", [row(i) for i in range(start, start + 10)])
        assert store.memory_shard_stats("ns")["part_points"] == [150, 150, 10]
        await store.wait_indexed()
        root = store.root / "memories" / "ns"
        indexed = [json.loads((d / "CURRENT").read_text())["indexed_points"] for d in (root, root / "part-0001",
                                                                                       root / "part-0002")]
        # The sealed parts are indexed to their last memory, though fewer than index_after arrived
        # after their previous build; the open part waits for index_after as before.
        assert indexed == [150, 150, 0]
        assert most_at_once == 1
        assert await top_id(store, dense_of(42), [1042]) == "m42"
    finally:
        watcher.cancel()
        await store.close()


async def test_memories_across_parts_through_the_service(tmp_path):
    service = await MemoryService(tmp_path / "home", {"AGENTMESH_MEMORY_PART_SIZE": "5"}).start()
    try:
        client = service.client
        for i in range(12):
            await client.remember(f"fact {i}: the {['red', 'green', 'blue'][i % 3]} key number{i}", namespace="team",
                                  id=f"f{i}")
        root = tmp_path / "home" / "memory" / "memories" / "team"
        assert sorted(p.name for p in root.glob("part-*")) == ["part-0001", "part-0002"]
        for i in (0, 6, 11):  # a sealed part's, another's, the open part's
            hits = await client.search(f"key number{i}", namespace="team", k=3)
            assert hits[0].memory.id == f"f{i}"
        listed, token = [], ""
        while True:
            page, token = await client.list_memories(namespace="team", page_size=4, page_token=token)
            listed += [m.id for m in page]
            if not token:
                break
        assert sorted(listed) == sorted(f"f{i}" for i in range(12))

        await client.remember("fact 1 rewritten: the golden key", namespace="team", id="f1")
        assert await client.forget(namespace="team", ids=["f2"]) == 1
        await service.restart()
        client = service.client
        assert (await client.get_memory("f1", namespace="team")).text == "fact 1 rewritten: the golden key"
        assert (await client.search("golden key", namespace="team", k=1))[0].memory.id == "f1"
        assert not [h for h in await client.search("key number2", namespace="team", k=12) if h.memory.id == "f2"]
        listed, token = [], ""
        while True:
            page, token = await client.list_memories(namespace="team", page_size=5, page_token=token)
            listed += [m.id for m in page]
            if not token:
                break
        assert sorted(listed) == sorted(f"f{i}" for i in range(12) if i != 2)
    finally:
        await service.stop()
