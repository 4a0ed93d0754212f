"""The usage port (agentmesh.memory.ports.UsageStore), against every adapter (store_adapters.py):
records upserted by id, scrolled by time in pages, kept across a reopen."""

from __future__ import annotations


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


async def test_usage_records_are_deleted_by_id_for_good(store_factory):
    store = await store_factory()
    await store.delete_usage(["never-there"])  # nothing recorded yet: nothing to do, no error
    await store.put_usage([{"id": f"run-2.{i}", "at": 1000.0 + i, "session_id": "s"} for i in range(4)])
    await store.delete_usage(["run-2.1", "run-2.3", "not-there"])
    store = await store_factory.reopen(store)
    page, _ = await store.scroll_usage(0, 0, 10, None)
    assert sorted(p["id"] for p in page) == ["run-2.0", "run-2.2"]
