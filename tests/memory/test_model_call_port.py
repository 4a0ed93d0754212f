"""Model calls' payloads on the transcript port (ports.MessageStore.put_model_calls /
list_model_calls), against every adapter (store_adapters.py): kept beside the session's messages,
unseen by them, read back after a reopen, and removed when the session is deleted."""

from __future__ import annotations


def call(session_id: str, n: int) -> dict:
    return {"id": f"run-1.{n}", "session_id": session_id, "run_id": "run-1", "at": 1000.0 + n, "model": "m",
            "provider": "openai", "request_json": '{"messages": []}', "response_json": f'{{"text": "a{n}"}}',
            "truncated": False, "purpose": "turn"}


async def test_calls_are_kept_beside_the_messages_and_go_with_the_session(store_factory):
    store = await store_factory()
    record = {"session_id": "s", "created_at": 5.0, "updated_at": 5.0, "message_count": 0}
    await store.put_session(record)
    said = [{"session_id": "s", "seq": 1, "role": "user", "content": "hi", "tool_calls": []}]
    await store.append_messages("s", said, {**record, "message_count": 1})
    await store.put_model_calls([call("s", 1), call("s", 2), call("other", 1)])
    await store.put_model_calls([call("s", 2)])  # written again: one record
    assert sorted(await store.list_model_calls("s"), key=lambda c: c["id"]) == [call("s", 1), call("s", 2)]
    assert await store.get_messages("s", range(1, 3)) == said

    store = await store_factory.reopen(store)
    assert len(await store.list_model_calls("s")) == 2
    await store.delete_session("s")
    assert await store.list_model_calls("s") == []
    assert await store.list_model_calls("other") == [call("other", 1)]
