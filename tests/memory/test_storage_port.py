"""One conformance suite for the storage port (agentmesh.memory.ports.Store), run against each adapter:

- `edge`, `edge-shared`: Qdrant Edge embedded (the default store), a shard per namespace / one shard;
- `edge-parts`: Qdrant Edge with parts of two memories (edge_parts.py), so that every case that
  writes more than two memories to a namespace crosses a part boundary;
- `server`: the Qdrant-server adapter (qdrant_store.QdrantStore) through qdrant-client's local mode.

There is no Qdrant server binary here, so the server adapter runs against local mode: the same
client API and models, so every request it builds is accepted and answered with the documented
semantics - but local mode is qdrant-client's Python re-implementation, not the server's engine,
and it ignores payload indexes (docs/memory.md says what this does and does not prove).
"""

from __future__ import annotations

import pytest

from agentmesh.memory.edge_store import EdgeStore
from agentmesh.memory.ports import DENSE, SPARSE, FusionPlan, PointFilter, point_id, stored_time
from agentmesh.memory.qdrant_store import QdrantStore

DIM = 4
EMBEDDER = "test-embedder"


def make_store(kind: str, home):
    if kind == "edge":
        return EdgeStore(home, layout="per-namespace")
    if kind == "edge-shared":
        return EdgeStore(home, layout="shared")
    if kind == "edge-parts":
        return EdgeStore(home, layout="per-namespace", part_size=2)
    return QdrantStore.connect(path=home / "qdrant", layout="shared")


@pytest.fixture(params=["edge", "edge-shared", "edge-parts", "server"])
async def store_factory(request, tmp_path):
    opened = []

    async def open_store():
        store = make_store(request.param, tmp_path / "home")
        await store.open()
        assert await store.check_embedder(EMBEDDER, DIM) == ""
        opened.append(store)
        return store

    async def reopen(store):
        await store.close()
        opened.remove(store)
        return await open_store()

    open_store.reopen = reopen
    yield open_store
    for store in opened:
        await store.close()


def memory(namespace, mid, text, *, kind="fact", created_at=1000.0, session="", metadata=None):
    return {
        "id": mid, "namespace": namespace, "text": text, "kind": kind, "metadata": metadata or {},
        "created_at": created_at, "updated_at": created_at, "source_session_id": session,
    }


def row(payload, dense, terms):
    """A memory row with a sparse vector of term ids (weight 1 each)."""
    return (point_id("memory", payload["namespace"], payload["id"]), dense, (sorted(terms), [1.0] * len(terms)), payload)


PLAN = FusionPlan(fusion="weighted", prefetch_limit=20, rrf_k=5, dense_weight=0.1, sparse_weight=1.0)


async def test_sessions_list_newest_first_find_children_and_delete_with_messages(store_factory):
    store = await store_factory()
    for i, sid in enumerate(["a", "b", "c"]):
        await store.put_session({"session_id": sid, "created_at": 100.0 + i, "labels": {"parent": "a" if sid != "a" else ""}})
    assert (await store.get_session("b"))["created_at"] == 101.0
    assert await store.get_session("nope") is None
    assert [s["session_id"] for s in await store.list_sessions(10, None)] == ["c", "b", "a"]
    assert [s["session_id"] for s in await store.list_sessions(10, 101.0)] == ["b", "a"]
    assert sorted(await store.child_sessions("a", "parent")) == ["b", "c"]

    await store.append_messages("b", [{"session_id": "b", "seq": s, "role": "user", "content": f"m{s}"} for s in (1, 2, 3)],
                                {"session_id": "b", "created_at": 101.0, "message_count": 3})
    assert [m["content"] for m in await store.get_messages("b", [3, 1, 2, 9])] == ["m1", "m2", "m3"]
    assert (await store.get_session("b"))["message_count"] == 3

    await store.delete_session("b")
    assert await store.get_session("b") is None
    assert await store.get_messages("b", [1, 2, 3]) == []


async def test_what_was_written_is_there_after_a_reopen(store_factory):
    store = await store_factory()
    await store.put_session({"session_id": "s", "created_at": 1.0})
    await store.put_messages("s", [{"session_id": "s", "seq": 1, "role": "user", "content": "hello"}])
    p = memory("ns", "m1", "tea")
    await store.upsert_memories("ns", [row(p, [1, 0, 0, 0], [7])])
    store = await store_factory.reopen(store)
    assert (await store.get_session("s"))["created_at"] == 1.0
    assert [m["content"] for m in await store.get_messages("s", [1])] == ["hello"]
    assert list((await store.get_memories("ns", [point_id("memory", "ns", "m1")])).values()) == [p]


async def test_sessions_and_transcripts_read_as_last_written_while_open_and_after_a_reopen(store_factory):
    # A turn's writes: a record changed a field or two at a time, messages past the count
    # overwritten (a dropped run), a field removed, a session deleted and made again. What the
    # open store answers (the embedded one from memory) must be what its files hold.
    store = await store_factory()
    record = {"session_id": "s", "title": "t", "created_at": 5.0, "updated_at": 5.0, "message_count": 0,
              "labels": {"team": "a"}, "namespace": "alice", "tools_allow": []}
    await store.put_session(record)
    assert await store.get_session("s") == record
    said = [{"session_id": "s", "seq": i, "role": "user", "content": f"m{i}", "tool_calls": []} for i in (1, 2, 3)]
    await store.append_messages("s", said, {**record, "message_count": 3, "updated_at": 6.0})
    assert (await store.get_session("s"))["message_count"] == 3
    assert await store.get_messages("s", range(1, 4)) == said

    # The run of seqs 2-3 dropped, then an append over them; then the labels and policy change.
    await store.put_session({**record, "message_count": 1, "updated_at": 7.0})
    again = [{"session_id": "s", "seq": 2, "role": "assistant", "content": "",
              "tool_calls": [{"call_id": "c1", "name": "shell", "arguments_json": "{}"}]}]
    await store.append_messages("s", again, {**record, "message_count": 2, "updated_at": 8.0})
    changed = {**record, "message_count": 2, "updated_at": 9.0, "labels": {"team": "b", "x": "y"},
               "tools_allow": ["shell"]}
    await store.put_session(changed)
    untitled = {k: v for k, v in changed.items() if k != "title"}
    await store.put_session({"session_id": "gone", "created_at": 1.0})
    await store.append_messages("gone", [{"session_id": "gone", "seq": 1, "role": "user", "content": "old"}],
                                {"session_id": "gone", "created_at": 1.0, "message_count": 1})
    await store.delete_session("gone")
    await store.put_session({"session_id": "gone", "created_at": 2.0, "message_count": 0})
    await store.put_session(untitled)

    async def state(store):
        return (await store.get_session("s"), await store.get_messages("s", [1, 2, 3]),
                await store.get_session("gone"), await store.get_messages("gone", [1]))

    expected = (untitled, [said[0], again[0], said[2]], {"session_id": "gone", "created_at": 2.0, "message_count": 0}, [])
    assert await state(store) == expected
    store = await store_factory.reopen(store)
    assert await state(store) == expected


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


async def test_a_store_filled_by_another_embedder_is_refused(store_factory):
    store = await store_factory()
    await store.upsert_memories("n", [row(memory("n", "a", "a"), [1, 0, 0, 0], [1])])
    store = await store_factory.reopen(store)
    refusal = await store.check_embedder("another-model", 8)
    assert "test-embedder" in refusal and "another-model" in refusal


async def test_timestamps_as_the_cores_keep_them_read_back_exactly(store_factory):
    # Edge parses a stored 17-digit float back one bit off about one time in eight; the cores
    # keep times to the microsecond (stored_time), which every adapter must return unchanged.
    import random

    store = await store_factory()
    rng = random.Random(5)
    times = [stored_time(1_795_000_000 + rng.random() * 10_000_000) for _ in range(300)]
    await store.put_messages("s", [{"session_id": "s", "seq": i + 1, "created_at": t} for i, t in enumerate(times)])
    assert [m["created_at"] for m in await store.get_messages("s", range(1, 301))] == times
    store = await store_factory.reopen(store)  # from the store's files, not what it kept in memory
    assert [m["created_at"] for m in await store.get_messages("s", range(1, 301))] == times


async def test_usage_records_are_upserted_by_id_scrolled_by_time_and_survive_reopening(store_factory):
    store = await store_factory()
    assert await store.scroll_usage(0, 0, 10, None) == ([], "")  # nothing recorded yet
    records = [{"id": f"run-1.{i}", "at": 1000.0 + i, "session_id": "s", "input_tokens": i} for i in range(5)]
    await store.put_usage(records)
    await store.put_usage([{**records[0], "input_tokens": 99}])  # the same id again: replaced, not added

    async def read(start, end, limit=2):
        found, offset = [], None
        while True:
            page, offset = await store.scroll_usage(start, end, limit, offset)
            found += page
            if not offset:
                return sorted(found, key=lambda p: p["at"])

    assert [p["input_tokens"] for p in await read(0, 0)] == [99, 1, 2, 3, 4]
    assert [p["id"] for p in await read(1001.0, 1003.0)] == ["run-1.1", "run-1.2"]  # [start, end)
    assert await read(2000.0, 0) == []
    store = await store_factory.reopen(store)
    assert len(await read(0, 0)) == 5
