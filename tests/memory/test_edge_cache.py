"""What the embedded store keeps in memory and how it lays out a turn's writes (edge_cache.py,
edge_store.py): bounded, and never in the way of what the shards hold — including points that
an earlier version wrote field by field."""

from __future__ import annotations

import random
import string
import uuid

import qdrant_edge as qe

from agentmesh.memory.edge_cache import TranscriptCache
from agentmesh.memory.edge_store import EdgeStore
from agentmesh.memory.ports import _ID_NAMESPACE, point_id


def test_point_ids_are_uuid5_of_the_parts():
    # Every stored point (and every home already written) is addressed by these ids.
    rng = random.Random(19)
    alphabet = string.printable + "éß中\x1f"
    for _ in range(2000):
        parts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24))) for _ in range(rng.randint(1, 4))]
        assert point_id(*parts) == str(uuid.uuid5(_ID_NAMESPACE, "\x1f".join(parts)))


def message(session_id: str, seq: int, content: str = "") -> dict:
    return {"session_id": session_id, "seq": seq, "role": "user", "content": content or f"{session_id}/{seq}",
            "tool_calls": [], "created_at": 1.5}


async def test_the_store_answers_from_its_shards_what_it_no_longer_keeps(tmp_path):
    store = EdgeStore(tmp_path, transcript_cache_bytes=40_000)
    await store.open()
    try:
        for s in range(40):
            sid = f"s{s}"
            await store.put_session({"session_id": sid, "created_at": 1.0, "message_count": 0})
            for seq in range(1, 11):
                await store.append_messages(sid, [message(sid, seq)],
                                            {"session_id": sid, "created_at": 1.0, "message_count": seq})
            assert store.cached_transcript_bytes <= 40_000  # bounded while it fills
        for s in range(40):
            sid = f"s{s}"
            assert (await store.get_session(sid))["message_count"] == 10
            assert await store.get_messages(sid, range(1, 11)) == [message(sid, seq) for seq in range(1, 11)]
        assert store.cached_transcript_bytes <= 40_000
    finally:
        await store.close()


def test_the_cache_drops_the_least_recently_used_and_keeps_one_big_session_s_record_only():
    cache = TranscriptCache(budget_bytes=10_000)
    cache.put_session("a", {"session_id": "a"})
    cache.put_messages("a", [message("a", 1)])
    cache.put_session("b", {"session_id": "b"})
    assert cache.session("a") == {"session_id": "a"}  # read: now the most recent
    cache.put_messages("c", [message("c", seq) for seq in range(1, 4)])
    assert cache.session("b") is not None and cache.size <= 10_000
    cache.put_messages("d", [message("d", 1, "x" * 20_000)])  # over the budget alone
    assert cache.messages("d", [1]) == ({}, [1]) and cache.size <= 10_000
    cache.forget("a")
    assert cache.messages("a", [1]) == ({}, [1])


async def test_messages_and_usage_written_field_by_field_before_are_read_as_they_were(tmp_path):
    # Points as an earlier version wrote them: every field its own payload key.
    store = EdgeStore(tmp_path)
    await store.open()
    old = message("s", 1, "written before")
    await store.put_session({"session_id": "s", "created_at": 1.0, "message_count": 2})
    store.messages.update(qe.UpdateOperation.upsert_points([qe.Point(point_id("message", "s", "1"), {}, old)]))
    await store.put_messages("s", [message("s", 2, "written now")])
    record = {"id": "run-1.0", "at": 100.0, "session_id": "s", "input_tokens": 7}
    await store.put_usage([{**record, "id": "run-1.1", "at": 101.0}])
    usage = store.usage_shard(create=True)
    assert usage is not None
    usage.update(qe.UpdateOperation.upsert_points([qe.Point(point_id("usage", "run-1.0"), {}, record)]))
    await store.close()

    store = EdgeStore(tmp_path)
    await store.open()
    try:
        assert await store.get_messages("s", [1, 2]) == [old, message("s", 2, "written now")]
        found, _ = await store.scroll_usage(0, 0, 10, None)
        assert sorted(found, key=lambda p: p["at"]) == [record, {**record, "id": "run-1.1", "at": 101.0}]
        # Deleting the session still finds its messages by their session, whichever way written.
        await store.delete_session("s")
        assert await store.get_messages("s", [1, 2]) == []
    finally:
        await store.close()
    store = EdgeStore(tmp_path)
    await store.open()
    try:
        assert await store.get_messages("s", [1, 2]) == []
    finally:
        await store.close()
