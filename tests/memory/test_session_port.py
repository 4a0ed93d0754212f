"""The session port (agentmesh.memory.ports.SessionStore), against every adapter (store_adapters.py):
records listed newest first, children found by label, deleted with their messages, kept across a reopen."""

from __future__ import annotations


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


async def test_session_records_are_there_after_a_reopen(store_factory):
    store = await store_factory()
    await store.put_session({"session_id": "s", "created_at": 1.0, "labels": {"parent": "p"}})
    store = await store_factory.reopen(store)
    assert (await store.get_session("s"))["created_at"] == 1.0
    assert await store.child_sessions("p", "parent") == ["s"]
    assert [s["session_id"] for s in await store.list_sessions(10, None)] == ["s"]
