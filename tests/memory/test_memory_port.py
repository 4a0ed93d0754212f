"""The long-term memory ports (agentmesh.memory.ports.MemoryStore and MemorySearch), against every
adapter (store_adapters.py): hybrid search that fuses both retrievers and never crosses namespaces,
filters, pages, time windows, deletes, the embedder check, and what survives a reopen."""

from __future__ import annotations

from agentmesh.memory.ports import DENSE, SPARSE, VECTOR_KEY, PointFilter, point_id
from tests.memory.store_adapters import PLAN, memory, row


async def test_hybrid_search_fuses_both_sides_and_never_crosses_namespaces(store_factory):
    store = await store_factory()
    rows = [
        row(memory("alice", "tea", "alice drinks tea"), [1, 0, 0, 0], [1, 2]),
        row(memory("alice", "car", "alice drives a car"), [0, 1, 0, 0], [1, 3]),
        row(memory("alice", "dog", "alice walks the dog"), [0, 0, 1, 0], [1, 4]),
    ]
    await store.upsert_memories("alice", rows)
    await store.upsert_memories("bob", [row(memory("bob", "tea", "bob drinks tea"), [1, 0, 0, 0], [2, 5])])

    hits = await store.hybrid_search(PointFilter("alice"), [0, 1, 0, 0], ([3], [1.0]), 3, PLAN)
    assert [p["id"] for _, _, p in hits][0] == "car"
    assert {p["namespace"] for _, _, p in hits} == {"alice"}
    assert hits[0][1] > hits[-1][1]
    # Only the dense side (a query of stop words has no sparse terms) still answers.
    assert [p["id"] for _, _, p in await store.hybrid_search(PointFilter("alice"), [0, 0, 1, 0], ([], []), 1, PLAN)] == ["dog"]
    assert [p["id"] for _, _, p in await store.ranked(PointFilter("alice"), ([2], [1.0]), SPARSE, 5)] == ["tea"]
    assert [p["id"] for _, _, p in await store.ranked(PointFilter("alice"), [0, 1, 0, 0], DENSE, 1)] == ["car"]
    assert await store.hybrid_search(PointFilter("carol"), [1, 0, 0, 0], ([2], [1.0]), 3, PLAN) == []
    # A known point id does not reach into another namespace.
    assert await store.get_memories("bob", [rows[0][0]]) == {}


async def test_filters_on_kind_metadata_time_and_session(store_factory):
    store = await store_factory()
    rows = [
        row(memory("n", "a", "a", kind="fact", created_at=10, metadata={"project": "atlas", "prio": 1, "done": True, "w": 0.5}), [1, 0, 0, 0], [1]),
        row(memory("n", "b", "b", kind="episode", created_at=20, session="s1", metadata={"project": "borealis", "done": False}), [1, 0, 0, 0], [1]),
        row(memory("n", "c", "c", kind="episode", created_at=30, session="s2", metadata={"prio": 2}), [1, 0, 0, 0], [1]),
    ]
    await store.upsert_memories("n", rows)

    async def ids(**conditions):
        found, _ = await store.scroll_memories(PointFilter("n", **conditions), 10, None)
        return sorted(p["id"] for _, p in found)

    assert await ids(kinds=("episode",)) == ["b", "c"]
    assert await ids(metadata=(("project", "atlas"),)) == ["a"]
    assert await ids(metadata=(("prio", 2),)) == ["c"]
    assert await ids(metadata=(("done", True),)) == ["a"]
    assert await ids(metadata=(("done", False),)) == ["b"]
    assert await ids(metadata=(("w", 0.5),)) == ["a"]
    assert await ids(created_after=20) == ["b", "c"]
    assert await ids(created_before=20) == ["a"]
    assert await ids(source_session_id="s2") == ["c"]
    assert await store.count_memories(PointFilter("n", kinds=("episode",))) == 2
    # What a read returns is the payload as written, nothing the adapter keeps beside it.
    found, _ = await store.scroll_memories(PointFilter("n", metadata=(("done", True),)), 10, None)
    assert found[0][1] == rows[0][3]
    hits = await store.hybrid_search(PointFilter("n", metadata=(("done", False),)), [1, 0, 0, 0], ([1], [1.0]), 5, PLAN)
    assert [p for _, _, p in hits] == [rows[1][3]]


async def test_scroll_pages_stream_windows_and_deletes(store_factory):
    store = await store_factory()
    rows = [row(memory("n", f"m{i}", f"turn {i}", kind="episode", created_at=float(i), session="s"), [1, 0, 0, 0], [i + 1])
            for i in range(7)]
    await store.upsert_memories("n", rows)

    seen, token = [], None
    while True:
        page, token = await store.scroll_memories(PointFilter("n"), 3, token)
        seen += [p["id"] for _, p in page]
        if not token:
            break
    assert sorted(seen) == sorted(p["id"] for *_, p in rows)

    before, inside, after = await store.stream_window(PointFilter("n", source_session_id="s"), 3.0, 4.0, edge=2)
    assert [p["id"] for _, p in before] == ["m2", "m1"]
    assert sorted(p["id"] for _, p in inside) == ["m3", "m4"]
    assert [p["id"] for _, p in after] == ["m5", "m6"]

    await store.delete_memories_by_ids("n", [rows[0][0]])
    assert await store.delete_memories_by_filter(PointFilter("n", created_after=5.0)) == 2
    assert await store.count_memories(PointFilter("n")) == 4
    assert await store.delete_memories_by_filter(PointFilter("n")) == 4
    assert await store.count_memories(PointFilter("n")) == 0
    assert await store.hybrid_search(PointFilter("n"), [1, 0, 0, 0], ([1], [1.0]), 3, PLAN) == []


async def test_a_scroll_with_vectors_gives_each_memorys_dense_vector(store_factory):
    """What `agentmesh export` writes: the dense vector as stored (cosine: unit length), across
    pages (and parts)."""
    store = await store_factory()
    dense = [[1.0, 0, 0, 0], [0, 0.6, 0.8, 0], [0, 0, 0, 1.0]]
    await store.upsert_memories("n", [row(memory("n", f"m{i}", f"turn {i}"), v, [i + 1]) for i, v in enumerate(dense)])
    seen, token = {}, None
    while True:
        page, token = await store.scroll_memories(PointFilter("n"), 2, token, with_vectors=True)
        seen.update({p["id"]: [round(x, 5) for x in p[VECTOR_KEY]] for _, p in page})
        if not token:
            break
    assert seen == {f"m{i}": v for i, v in enumerate(dense)}
    plain, _ = await store.scroll_memories(PointFilter("n"), 5, None)
    assert all(VECTOR_KEY not in p for _, p in plain)


async def test_a_store_filled_by_another_embedder_is_refused(store_factory):
    store = await store_factory()
    await store.upsert_memories("n", [row(memory("n", "a", "a"), [1, 0, 0, 0], [1])])
    store = await store_factory.reopen(store)
    refusal = await store.check_embedder("another-model", 8)
    assert "test-embedder" in refusal and "another-model" in refusal


async def test_memories_are_there_after_a_reopen(store_factory):
    store = await store_factory()
    p = memory("ns", "m1", "tea")
    await store.upsert_memories("ns", [row(p, [1, 0, 0, 0], [7])])
    store = await store_factory.reopen(store)
    assert list((await store.get_memories("ns", [point_id("memory", "ns", "m1")])).values()) == [p]
    assert await store.count_memories(PointFilter("ns")) == 1
