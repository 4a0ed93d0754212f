"""Conformance suite for the document port (agentmesh.memory.ports.DocumentStore), which keeps
standing instructions, skills, promoted tools and reflection runs, run against each adapter:

- `edge`: a payload shard of the embedded Qdrant Edge home (edge_documents.py, the default);
- `server`: the Qdrant-server adapter (qdrant_documents.py) through qdrant-client's local mode,
  with what that does and does not prove as in store_adapters.py.

Each opens through `stores.open_documents`, beside its memory store, as the memory service does.
"""

from __future__ import annotations

import json

import pytest
import qdrant_edge as qe

from agentmesh.memory.edge_store import EdgeStore
from agentmesh.memory.ports import VERSION, document_point
from agentmesh.memory.qdrant_store import QdrantStore
from agentmesh.memory.stores import open_documents


@pytest.fixture(params=["edge", "server"])
async def documents_factory(request, tmp_path):
    opened = []

    async def open_pair():
        home = tmp_path / "home"
        store = EdgeStore(home) if request.param == "edge" else QdrantStore.connect(path=home / "qdrant")
        await store.open()
        opened.append(store)
        return store, await open_documents(store)

    async def reopen(store):
        await store.close()
        opened.remove(store)
        return await open_pair()

    open_pair.reopen = reopen
    yield open_pair
    for store in opened:
        await store.close()


SKILL = {"name": "deploy", "versions": {"1": {"status": "active"}}, "created_at": 1732400000.123456, "auto": False,
         "paths": ["SKILL.md", "scripts/run.sh"], "count": 3}


async def test_a_document_is_put_read_replaced_and_deleted(documents_factory):
    _, documents = await documents_factory()
    assert await documents.get_document("skill", "team-a", "deploy") is None
    await documents.put_document("skill", "team-a", "deploy", SKILL)
    assert await documents.get_document("skill", "team-a", "deploy") == SKILL

    await documents.put_document("skill", "team-a", "deploy", {**SKILL, "count": 4})
    assert (await documents.get_document("skill", "team-a", "deploy"))["count"] == 4
    assert [key for key, _ in await documents.list_documents("skill", "team-a")] == ["deploy"]

    assert await documents.delete_document("skill", "team-a", "deploy") is True
    assert await documents.delete_document("skill", "team-a", "deploy") is False
    assert await documents.get_document("skill", "team-a", "deploy") is None
    assert await documents.list_documents("skill", "team-a") == []


async def test_a_list_shows_every_write_made_since_the_last_list(documents_factory):
    # A turn's start lists a namespace's profile, skills and tools every time; a change made
    # between two turns must show in the next one (the embedded adapter keeps listings).
    _, documents = await documents_factory()
    assert await documents.list_documents("profile", "team-a") == []
    await documents.put_document("profile", "team-a", "soul", {"text": "Be brief."})
    assert await documents.list_documents("profile", "team-a") == [("soul", {"text": "Be brief."})]
    await documents.put_document("profile", "team-a", "soul", {"text": "Be thorough."})
    await documents.put_document("profile", "team-a", "user", {"text": "Alice."})
    await documents.put_document("profile", "team-b", "soul", {"text": "Other team."})
    assert await documents.list_documents("profile", "team-a") == [("soul", {"text": "Be thorough."}),
                                                                   ("user", {"text": "Alice."})]
    assert await documents.delete_document("profile", "team-a", "soul") is True
    assert await documents.list_documents("profile", "team-a") == [("user", {"text": "Alice."})]
    assert await documents.list_documents("profile", "team-b") == [("soul", {"text": "Other team."})]


async def test_lists_keep_to_their_kind_and_namespace_sorted_by_key_past_a_page(documents_factory):
    _, documents = await documents_factory()
    for i in range(300):  # more than one scroll page
        await documents.put_document("tool", "team-a", f"t{i:03d}", {"i": i})
    await documents.put_document("tool", "team-b", "t000", {"i": -1})
    await documents.put_document("skill", "team-a", "t000", {"i": -2})

    listed = await documents.list_documents("tool", "team-a")
    assert [key for key, _ in listed] == [f"t{i:03d}" for i in range(300)]
    assert [body["i"] for _, body in listed] == list(range(300))
    assert await documents.list_documents("tool", "team-b") == [("t000", {"i": -1})]
    assert await documents.list_documents("skill", "team-a") == [("t000", {"i": -2})]
    assert await documents.get_document("tool", "team-c", "t000") is None

    assert await documents.delete_document("tool", "team-b", "t000") is True
    assert (await documents.get_document("tool", "team-a", "t000")) == {"i": 0}  # the others' stay


async def test_documents_are_there_after_a_reopen(documents_factory):
    store, documents = await documents_factory()
    await documents.put_document("profile", "team-a", "soul", {"text": "You are terse.", "updated_at": 1732400000.5})
    await documents.put_document("reflection", "team-a", "s-1", {"last_seq": 7, "runs": [{"status": "done"}]})
    store, documents = await documents_factory.reopen(store)
    assert await documents.get_document("profile", "team-a", "soul") == {"text": "You are terse.", "updated_at": 1732400000.5}
    assert await documents.list_documents("reflection", "team-a") == [("s-1", {"last_seq": 7, "runs": [{"status": "done"}]})]


async def test_documents_and_memories_share_a_home_without_touching_each_other(documents_factory):
    store, documents = await documents_factory()
    await store.put_session({"session_id": "s", "created_at": 1.0})
    await documents.put_document("profile", "default", "user", {"text": "Ada"})
    assert await store.list_sessions(10, None) == [{"session_id": "s", "created_at": 1.0}]
    assert await documents.list_documents("profile", "default") == [("user", {"text": "Ada"})]


async def test_mcp_registrations_are_kept_per_namespace_move_its_version_and_survive_a_reopen(documents_factory):
    """A namespace's MCP servers (mcp_registry.py) on each adapter: kept by name beside the tool
    policy, each change moving the namespace's mcp_servers_version, which a policy update keeps."""
    from agentmesh.errors import AlreadyExists, NotFound
    from agentmesh.memory.mcp_registry import McpRegistration, McpRegistry
    from agentmesh.memory.namespaces import Namespaces

    store, documents = await documents_factory()
    namespaces = Namespaces(store)
    registry = McpRegistry(documents, namespaces)
    assert await registry.list("team-a") == ([], 0.0)

    docs = McpRegistration(name="docs", url="https://mcp.example.com/mcp", headers={"X-Team": "a"},
                           header_secrets={"Authorization": "DOCS_TOKEN"})
    first = await registry.put("team-a", docs)
    time_server = McpRegistration(name="time", command="/usr/bin/mcp-server-time", args=("--local-timezone", "UTC"),
                                  env_secrets={"API_KEY": "TIME_KEY"})
    second = await registry.put("team-a", time_server, only_if_absent=True)
    assert 0 < first < second
    with pytest.raises(AlreadyExists):
        await registry.put("team-a", docs, only_if_absent=True)
    assert (await namespaces.get("team-a")).mcp_servers_version == second  # nothing moved on a refusal

    servers, version = await registry.list("team-a")
    assert version == second and [s.name for s in servers] == ["docs", "time"]
    assert servers[0].header_secrets == {"Authorization": "DOCS_TOKEN"} and servers[0].added_at > 0
    assert servers[1].args == ("--local-timezone", "UTC") and servers[1].env_secrets == {"API_KEY": "TIME_KEY"}
    assert await registry.list("team-b") == ([], 0.0)  # another namespace sees none of them

    # The tool policy and the MCP version share the namespace's record: neither erases the other.
    await namespaces.update("team-a", ["docs__*"], [])
    assert (await namespaces.get("team-a")).mcp_servers_version == second

    store, documents = await documents_factory.reopen(store)
    namespaces = Namespaces(store)
    registry = McpRegistry(documents, namespaces)
    servers, version = await registry.list("team-a")
    assert version == second and [s.name for s in servers] == ["docs", "time"]
    assert (await namespaces.get("team-a")).tools_allow == ["docs__*"]

    third = await registry.remove("team-a", "docs")
    assert third > second
    with pytest.raises(NotFound, match="has no MCP server 'docs'; it has time"):
        await registry.remove("team-a", "docs")
    servers, version = await registry.list("team-a")
    assert version == third and [s.name for s in servers] == ["time"]


async def test_a2a_tasks_are_kept_per_namespace_up_to_their_bound(documents_factory):
    """The gateways' A2A tasks (a2a_tasks.py) on each adapter: read back by id in their namespace
    only, replaced in place, the oldest forgotten past the bound."""
    from agentmesh.errors import InvalidArgument, NotFound
    from agentmesh.memory.a2a_tasks import A2aTasks

    store, documents = await documents_factory()
    tasks = A2aTasks(documents, max_tasks=3)
    assert await tasks.put("team-a", "t1", '{"id": "t1", "status": {"state": "TASK_STATE_SUBMITTED"}}') is True
    assert await tasks.put("team-a", "t1", '{"id": "t1", "status": {"state": "TASK_STATE_COMPLETED"}}') is False
    assert "COMPLETED" in (await tasks.get("team-a", "t1"))[0]
    with pytest.raises(NotFound):
        await tasks.get("team-b", "t1")
    for task_id in ("t2", "t3", "t4"):
        await tasks.put("team-a", task_id, "{}")
    with pytest.raises(NotFound, match="has no A2A task 't1'"):
        await tasks.get("team-a", "t1")  # the oldest, past the bound of 3
    store, documents = await documents_factory.reopen(store)
    tasks = A2aTasks(documents, max_tasks=3)
    assert [(await tasks.get("team-a", t))[0] for t in ("t2", "t3", "t4")] == ["{}"] * 3
    with pytest.raises(InvalidArgument):
        await tasks.put("team-a", "../x", "{}")


async def test_a_swap_lands_only_on_the_version_it_expects(documents_factory):
    # Teams (memory/teams.py) claim tasks and append to mailboxes with this compare-and-set.
    _, documents = await documents_factory()
    assert await documents.swap_document("team_board", "team-a", "s1", {"tasks": []}, 1) is False
    assert await documents.get_document("team_board", "team-a", "s1") is None
    assert await documents.swap_document("team_board", "team-a", "s1", {"tasks": [1]}, 0) is True
    assert (await documents.get_document("team_board", "team-a", "s1"))["_v"] == 1
    # A second creator, and a writer that read version 1 after another moved it on, both lose.
    assert await documents.swap_document("team_board", "team-a", "s1", {"tasks": [2]}, 0) is False
    assert await documents.swap_document("team_board", "team-a", "s1", {"tasks": [1, 2]}, 1) is True
    assert await documents.swap_document("team_board", "team-a", "s1", {"tasks": [9]}, 1) is False
    stored = await documents.get_document("team_board", "team-a", "s1")
    assert stored["tasks"] == [1, 2] and stored["_v"] == 2
    assert [key for key, _ in await documents.list_documents("team_board", "team-a")] == ["s1"]


async def test_concurrent_swaps_of_one_version_let_exactly_one_win(documents_factory):
    import asyncio

    _, documents = await documents_factory()
    assert await documents.swap_document("team_board", "team-a", "s1", {"owner": ""}, 0)
    wins = await asyncio.gather(*(documents.swap_document("team_board", "team-a", "s1", {"owner": f"m{i}"}, 1)
                                  for i in range(6)))
    assert sum(wins) == 1
    winner = wins.index(True)
    assert (await documents.get_document("team_board", "team-a", "s1"))["owner"] == f"m{winner}"


# --- the embedded adapter's stored form (edge_documents.py) ---------------------------------


async def _edge_documents(tmp_path):
    store = EdgeStore(tmp_path / "edge-home")
    await store.open()
    return store, await open_documents(store)


async def test_the_embedded_store_keeps_a_body_as_one_json_text_beside_what_lists_filter_on(tmp_path):
    store, documents = await _edge_documents(tmp_path)
    try:
        await documents.put_document("skill", "team-a", "deploy", SKILL)
        [point] = documents.shard.shard.retrieve([document_point("skill", "team-a", "deploy")], True, False)
        stored = dict(point.payload)
        assert set(stored) == {"kind", "namespace", "key", "_json"}
        assert json.loads(stored["_json"]) == SKILL
        assert await documents.get_document("skill", "team-a", "deploy") == SKILL
    finally:
        await store.close()


async def test_a_document_stored_with_a_nested_body_is_still_read_swapped_and_listed(tmp_path):
    store, documents = await _edge_documents(tmp_path)
    try:
        # As a store written before bodies were kept as JSON text holds it.
        point = document_point("skill", "team-a", "deploy")
        old = {"kind": "skill", "namespace": "team-a", "key": "deploy", "body": {**SKILL, VERSION: 1}}
        documents.shard.update(qe.UpdateOperation.upsert_points([qe.Point(point, {}, old)]))

        assert await documents.get_document("skill", "team-a", "deploy") == {**SKILL, VERSION: 1}
        assert await documents.list_documents("skill", "team-a") == [("deploy", {**SKILL, VERSION: 1})]
        assert await documents.swap_document("skill", "team-a", "deploy", {**SKILL, "count": 9}, expect=1) is True
        assert await documents.get_document("skill", "team-a", "deploy") == {**SKILL, "count": 9, VERSION: 2}
        assert await documents.list_documents("skill", "team-a") == [("deploy", {**SKILL, "count": 9, VERSION: 2})]
    finally:
        await store.close()
