"""Conformance suite for the named-agent port (agentmesh.memory.ports.AgentStore), run against each
document adapter (the embedded Edge shard and the Qdrant-server adapter in local mode, as
test_document_port.py opens them): versions are immutable, heads are replaced whole, agents of
one namespace never show in another, a delete removes the head and every version, and all of it
is there after a reopen."""

from __future__ import annotations


def version(name, n, instructions="x"):
    return {"name": name, "version": n, "created_at": 1732400000.5 + n, "rolled_back_from": 0,
            "spec": {"name": name, "instructions": instructions, "tools": {"allow": ["read_file"], "deny": []}}}


async def test_versions_are_immutable_and_listed_oldest_first(documents_factory):
    _, agents = await documents_factory()
    assert await agents.list_agent_versions("team", "reviewer") == []
    for n in (1, 2, 10):
        assert await agents.put_agent_version("team", version("reviewer", n, f"v{n}")) is True
    # A version that exists is never replaced.
    assert await agents.put_agent_version("team", version("reviewer", 2, "changed")) is False
    assert (await agents.get_agent_version("team", "reviewer", 2))["spec"]["instructions"] == "v2"
    assert await agents.get_agent_version("team", "reviewer", 3) is None
    listed = await agents.list_agent_versions("team", "reviewer")
    assert [v["version"] for v in listed] == [1, 2, 10]
    # A name that is another's prefix keeps to its own versions.
    await agents.put_agent_version("team", version("reviewer-2", 1))
    assert [v["version"] for v in await agents.list_agent_versions("team", "reviewer")] == [1, 2, 10]


async def test_heads_are_replaced_whole_and_kept_per_namespace(documents_factory):
    _, agents = await documents_factory()
    await agents.put_agent_head("team", {"name": "b", "latest": 1, "current": 1})
    await agents.put_agent_head("team", {"name": "a", "latest": 3, "current": 1})
    await agents.put_agent_head("team", {"name": "b", "latest": 2, "current": 2})
    await agents.put_agent_head("other", {"name": "a", "latest": 1, "current": 1})
    assert await agents.list_agent_heads("team") == [{"name": "a", "latest": 3, "current": 1},
                                                     {"name": "b", "latest": 2, "current": 2}]
    assert await agents.list_agent_heads("other") == [{"name": "a", "latest": 1, "current": 1}]
    assert await agents.list_agent_heads("empty") == []


async def test_a_delete_removes_the_head_and_every_version_of_that_agent_only(documents_factory):
    _, agents = await documents_factory()
    for n in (1, 2):
        await agents.put_agent_version("team", version("a", n))
    await agents.put_agent_version("team", version("ab", 1))
    await agents.put_agent_version("other", version("a", 1))
    await agents.put_agent_head("team", {"name": "a", "latest": 2, "current": 2})
    await agents.put_agent_head("team", {"name": "ab", "latest": 1, "current": 1})
    assert await agents.delete_agent("team", "a") == 2
    assert [h["name"] for h in await agents.list_agent_heads("team")] == ["ab"]
    assert await agents.list_agent_versions("team", "a") == []
    assert len(await agents.list_agent_versions("team", "ab")) == 1
    assert len(await agents.list_agent_versions("other", "a")) == 1
    assert await agents.delete_agent("team", "a") == 0


async def test_agents_are_there_after_a_reopen(documents_factory):
    store, agents = await documents_factory()
    await agents.put_agent_version("team", version("a", 1, "kept"))
    await agents.put_agent_head("team", {"name": "a", "latest": 1, "current": 1})
    store, agents = await documents_factory.reopen(store)
    assert (await agents.get_agent_version("team", "a", 1))["spec"]["instructions"] == "kept"
    assert await agents.list_agent_heads("team") == [{"name": "a", "latest": 1, "current": 1}]
    assert await agents.put_agent_version("team", version("a", 1, "again")) is False
