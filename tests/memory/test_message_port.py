"""The transcript-message port (agentmesh.memory.ports.MessageStore), against every adapter
(store_adapters.py): messages read back as last written — appended with the record that makes them
visible, overwritten, their session deleted and made again — while open and after a reopen, with
times exactly as the cores keep them."""

from __future__ import annotations

from agentmesh.memory.ports import stored_time


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


# --- model calls' payloads, kept beside the messages (put_model_calls / list_model_calls) ---

def model_call(session_id: str, n: int) -> dict:
    return {"id": f"run-1.{n}", "session_id": session_id, "run_id": "run-1", "at": 1000.0 + n, "model": "m",
            "provider": "openai", "request_json": '{"messages": []}', "response_json": f'{{"text": "a{n}"}}',
            "truncated": False, "purpose": "turn"}


async def test_calls_are_kept_beside_the_messages_and_go_with_the_session(store_factory):
    store = await store_factory()
    record = {"session_id": "s", "created_at": 5.0, "updated_at": 5.0, "message_count": 0}
    await store.put_session(record)
    said = [{"session_id": "s", "seq": 1, "role": "user", "content": "hi", "tool_calls": []}]
    await store.append_messages("s", said, {**record, "message_count": 1})
    await store.put_model_calls([model_call("s", 1), model_call("s", 2), model_call("other", 1)])
    await store.put_model_calls([model_call("s", 2)])  # written again: one record
    assert sorted(await store.list_model_calls("s"), key=lambda c: c["id"]) == [model_call("s", 1), model_call("s", 2)]
    assert await store.get_messages("s", range(1, 3)) == said

    store = await store_factory.reopen(store)
    assert len(await store.list_model_calls("s")) == 2
    await store.delete_session("s")
    assert await store.list_model_calls("s") == []
    assert await store.list_model_calls("other") == [model_call("other", 1)]
