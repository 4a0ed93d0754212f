"""Memory's team records (memory/teams.py, docs/teams.md): a compare-and-set per record, listing
by team, the wait an idle teammate sleeps in, and bad input refused with nothing changed."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentmesh.errors import InvalidArgument
from agentmesh.memory.edge_store import EdgeStore
from agentmesh.memory.qdrant_store import QdrantStore
from agentmesh.memory.stores import open_documents
from agentmesh.memory.teams import TeamRecords


@pytest.fixture
async def teams(tmp_path):
    store = EdgeStore(tmp_path / "home")
    await store.open()
    yield TeamRecords(await open_documents(store))
    await store.close()


async def test_a_swap_lands_on_its_version_and_lists_keep_to_their_team(teams):
    swapped, current = await teams.swap("default", "lead1", "mate", "alice", json.dumps({"state": "started"}), 0)
    assert swapped and current["state"] == "started" and current["_v"] == 1
    swapped, current = await teams.swap("default", "lead1", "mate", "alice", json.dumps({"state": "x"}), 0)
    assert not swapped and current["state"] == "started"  # a second spawn of alice loses
    assert (await teams.swap("default", "lead1", "mate", "alice", json.dumps({"state": "idle"}), 1))[0]
    await teams.swap("default", "lead2", "mate", "bob", "{}", 0)
    assert [key for key, _ in await teams.list("default", "lead1", "mate")] == ["alice"]
    assert await teams.list("default", "lead1", "mail") == []


async def test_a_waiter_wakes_on_the_teams_next_change_and_not_on_anothers(teams):
    change = await teams.wait("default", "lead1", -1, 0)
    waiting = asyncio.create_task(teams.wait("default", "lead1", change, 30))
    await teams.swap("default", "lead2", "mail", "bob", "{}", 0)  # another team: no wake
    await asyncio.sleep(0)
    assert not waiting.done()
    await teams.swap("default", "lead1", "mail", "alice", "{}", 0)
    assert await waiting == change + 1
    # Timing out answers the change number as it is.
    assert await teams.wait("default", "lead1", change + 1, 0.01) == change + 1


@pytest.mark.parametrize(("kind", "key", "body", "field"), [
    ("teams", "alice", "{}", "kind"),
    ("mate", "", "{}", "key"),
    ("mate", "a/b", "{}", "key"),
    ("mate", "alice", "[1]", "body_json"),
    ("mate", "alice", "{nope", "body_json"),
    ("mate", "alice", json.dumps({"text": "x" * 300_000}), "body_json"),
])
async def test_bad_records_are_refused_with_nothing_changed(teams, kind, key, body, field):
    with pytest.raises(InvalidArgument) as info:
        await teams.swap("default", "lead1", kind, key, body, 0)
    assert info.value.metadata.get("field", field) == field
    assert await teams.list("default", "lead1", "mate") == []


async def test_a_namespace_wide_listing_names_each_records_team(teams):
    await teams.swap("default", "lead1", "mate", "alice", "{}", 0)
    await teams.swap("default", "lead2", "mate", "bob", "{}", 0)
    await teams.swap("other", "lead3", "mate", "carol", "{}", 0)
    assert [key for key, _ in await teams.list("default", "", "mate")] == ["lead1/alice", "lead2/bob"]


@pytest.mark.parametrize("adapter", ["edge", "server"])
async def test_a_change_through_another_replica_wakes_a_waiter_here(tmp_path, adapter):
    # Two memory replicas sharing one store (as two pods share a Qdrant server — here its adapter
    # in qdrant-client's local mode): each has its own waiters, and the change number is the
    # same whichever answers.
    home = tmp_path / "home"
    store = EdgeStore(home) if adapter == "edge" else QdrantStore.connect(path=home / "qdrant")
    await store.open()
    try:
        documents = await open_documents(store)
        here, there = TeamRecords(documents), TeamRecords(documents)
        await there.swap("default", "lead1", "mate", "alice", "{}", 0)
        change = await here.wait("default", "lead1", -1, 0)
        assert change == await there.wait("default", "lead1", -1, 0) == 1
        waiting = asyncio.create_task(here.wait("default", "lead1", change, 30))
        await asyncio.sleep(0)
        assert not waiting.done()
        await there.swap("default", "lead1", "mail", "alice", "{}", 0)
        assert await waiting == change + 1
    finally:
        await store.close()
