"""The life cycle of a store (agentmesh.memory.ports.StoreLifecycle), against every adapter
(store_adapters.py): opening creates what is missing, opening after a close finds what was
written, a store opened and closed unused opens again, and `where` names the place for a person."""

from __future__ import annotations

from tests.memory.store_adapters import ADAPTERS, make_store


async def test_a_store_opens_empty_closes_and_opens_again_on_what_it_wrote(store_factory):
    store = await store_factory()
    assert store.where  # a path or URL for messages a person reads
    assert await store.get_session("s") is None
    await store.put_session({"session_id": "s", "created_at": 1.0})
    store = await store_factory.reopen(store)
    assert (await store.get_session("s"))["created_at"] == 1.0


async def test_a_store_opened_and_closed_unused_opens_again(tmp_path):
    # Closing must release what opening took (files, locks), whatever the adapter.
    for kind in ADAPTERS:
        for _ in range(2):
            store = make_store(kind, tmp_path / kind)
            await store.open()
            assert await store.get_session("s") is None
            await store.close()
