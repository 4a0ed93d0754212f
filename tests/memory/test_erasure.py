"""Erasing a person (docs/memory.md#erasure) over the real services: after `EraseUser` nothing of
theirs can be read by any door — the session list, the session, its transcript, its workspace,
memory search and listing, recall over conversations, their `user` block, usage, the export —
while another person's records in the same namespace stay.

Who made a record is the principal the call ran for: the test signs its calls for alice or bob
(as the agent signs a turn's writes for the person chatting), and reaches the gateway as a user
with a token (the erasure, over HTTP too, and a session created through the gateway).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time

import grpc
import httpx
import pytest

from agentmesh.internal.v1 import memory_service_pb2, memory_service_pb2_grpc
from agentmesh.rpc.auth import current_principal
from agentmesh.rpc.identity import Principal
from agentmesh.tenancy import token_digest
from agentmesh.v1 import common_pb2, gateway_pb2, learning_pb2, sessions_pb2, tools_pb2
from tests.support.identities import signed_channel
from tests.support.stack import Stack

SERVICES = ("memory", "tools", "gateway")
TOKEN = "tok-admin-0123456789abcdef"
BEARER = (("authorization", f"Bearer {TOKEN}"),)
ADMIN = "default=admin"  # what a static token's holder is: admin of every namespace


@contextlib.contextmanager
def acting_as(subject: str):
    """Calls signed from here on run for `subject` (the agent signs a turn's calls this way)."""
    token = current_principal.set(Principal(subject=subject, tenant=ADMIN))
    try:
        yield
    finally:
        current_principal.reset(token)


async def _leave_traces(stack: Stack, who: str, session_id: str) -> None:
    memory = stack.memory_stub()
    with acting_as(who):
        await memory.PutSession(memory_service_pb2.PutSessionRequest(session=sessions_pb2.Session(
            session_id=session_id, namespace="team")))
        await memory.AppendMessages(memory_service_pb2.AppendMessagesRequest(
            session_id=session_id, messages=[common_pb2.Message(role="user", content=f"{who} talks about zebras")],
            usage=[memory_service_pb2.UsageRecord(id=f"{session_id}.1", at=time.time(), session_id=session_id,
                                          namespace="team", model_name="default", model="m", provider="scripted",
                                          input_tokens=3, output_tokens=4)]))
        await memory.Remember(memory_service_pb2.RememberRequest(namespace="team", text=f"{who} keeps zebras in {session_id}",
                                                         source_session_id=session_id))
        await memory.Remember(memory_service_pb2.RememberRequest(namespace="team", text=f"{who} prefers striped zebras ({session_id})"))
    # Their `user` block, as the agent writes it in their turn.
    channel = signed_channel(stack.settings.keys_dir, "agent", "memory", stack.addresses["memory"])
    with acting_as(who):
        await memory_service_pb2_grpc.MemoryStub(channel).EditBlock(learning_pb2.EditBlockRequest(
            namespace="team", name="user", change="append", text=f"{who} rides zebras ({session_id})."))
    await channel.close()
    await stack.gateway_stub().WriteWorkspaceFile(tools_pb2.WriteWorkspaceFileRequest(
        session_id=session_id, path="zebras.txt", content=b"stripes"), metadata=BEARER)


async def _readable(stack: Stack, who: str, session_id: str) -> list[str]:
    """Every door through which something of `who`'s can still be read."""
    gateway, found = stack.gateway_stub(), []
    listed = await gateway.ListSessions(sessions_pb2.ListSessionsRequest(page_size=500), metadata=BEARER)
    if any(s.session_id == session_id or s.created_by == who for s in listed.sessions):
        found.append("session list")
    for door, call in (("session", gateway.GetSession(sessions_pb2.GetSessionRequest(session_id=session_id),
                                                      metadata=BEARER)),
                       ("transcript", gateway.GetTranscript(sessions_pb2.GetTranscriptRequest(session_id=session_id),
                                                            metadata=BEARER))):
        try:
            await call
            found.append(door)
        except grpc.aio.AioRpcError as err:
            assert err.code() == grpc.StatusCode.NOT_FOUND
    if (stack.settings.home / "workspaces" / session_id).exists():
        found.append("workspace")
    hits = await gateway.SearchMemory(
        gateway_pb2.SearchMemoryRequest(namespace="team", query=f"{who} zebras", k=100),
        metadata=BEARER)
    if any(who in h.text for h in hits.hits):
        found.append("search")
    recalled = await gateway.SearchConversations(learning_pb2.SearchConversationsRequest(
        namespace="team", query=f"{who} talks about zebras", k=50), metadata=BEARER)
    if any(who in h.text for h in recalled.hits):
        found.append("recall")
    blocks = await gateway.ListBlocks(learning_pb2.ListBlocksRequest(namespace="team", all_users=True),
                                      metadata=BEARER)
    if any(b.user == who or who in b.text for b in blocks.blocks):
        found.append("block")
    listing = await stack.memory_stub().ListMemories(memory_service_pb2.ListMemoriesRequest(namespace="team", page_size=1000))
    if any(who in m.text for m in listing.memories):
        found.append("memory list")
    channel = signed_channel(stack.settings.keys_dir, "gateway", "memory", stack.addresses["memory"])
    usage = await memory_service_pb2_grpc.MemoryStub(channel).SumUsage(memory_service_pb2.SumUsageRequest(group_by="session"))
    await channel.close()
    if any(s.key == session_id for s in usage.sums):
        found.append("usage")
    return found


async def _exported(stack: Stack) -> str:
    """`agentmesh export team` as an admin runs it: the last door."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTMESH_")}
    env.update({f"AGENTMESH_{n.upper()}_ADDR": a for n, a in stack.addresses.items()})
    env.update({"AGENTMESH_HOME": stack.env["AGENTMESH_HOME"], "AGENTMESH_AUTH_TOKEN": TOKEN})
    done = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "agentmesh.cli.main", "export", "team"],
                                   env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_erasing_a_person_leaves_nothing_of_them_readable_and_keeps_the_others(tmp_path):
    env = {"AGENTMESH_AUTH_TOKENS": TOKEN}
    async with Stack(tmp_path / "home", env=env, services=(*SERVICES, "scheduler")) as stack:
        await _leave_traces(stack, "user:alice", "alice-1")
        await _leave_traces(stack, "user:alice", "alice-2")
        await _leave_traces(stack, "user:bob", "bob-1")
        everything = ["session list", "session", "transcript", "workspace", "search", "recall", "block",
                      "memory list", "usage"]
        assert await _readable(stack, "user:alice", "alice-1") == everything

        erased = await stack.gateway_stub().EraseUser(
            sessions_pb2.EraseUserRequest(namespace="team", user="user:alice"), metadata=BEARER)

        assert erased.done and sorted(erased.sessions) == ["alice-1", "alice-2"]
        assert (erased.memories_removed, erased.usage_removed) == (4, 2)
        assert await _readable(stack, "user:alice", "alice-1") == []
        assert await _readable(stack, "user:alice", "alice-2") == []
        assert await _readable(stack, "user:bob", "bob-1") == everything
        exported = await _exported(stack)
        assert "alice" not in exported and "bob keeps zebras" in exported and "user:bob rides zebras" in exported
        # Nothing comes back after a restart (nothing was only hidden in a cache).
        await stack.restart()
        assert await _readable(stack, "user:alice", "alice-1") == []
    # Nor is anything of theirs left on disk in the conversation index (which a search never
    # answered): the store read directly, the services stopped.
    assert await indexed_conversations(tmp_path / "home", "team") == ["bob-1"]


async def indexed_conversations(home, namespace: str) -> list[str]:
    """The sessions with entries in `namespace`'s conversation index, read from the store on disk."""
    from agentmesh.memory.edge_store import EdgeStore
    from agentmesh.memory.ports import PointFilter
    from agentmesh.memory.recall import index_namespace

    store = EdgeStore(home)
    await store.open()
    await store.check_embedder("hashing-v1", 512)  # what the service indexed with
    try:
        page, _ = await store.scroll_memories(PointFilter(index_namespace(namespace)), 1000, None)
    finally:
        await store.close()
    return sorted({p["source_session_id"] for _, p in page})


async def test_erasure_over_http_and_a_gateway_session_records_its_creator(tmp_path):
    env = {"AGENTMESH_AUTH_TOKENS": TOKEN}
    async with Stack(tmp_path / "home", env=env, services=SERVICES) as stack:
        session = await stack.gateway_stub().CreateSession(
            gateway_pb2.CreateSessionRequest(namespace="team"),
            metadata=BEARER)
        me = f"user:{token_digest(TOKEN)[:12]}"
        assert session.created_by == me
        async with httpx.AsyncClient(base_url=stack.http_url, headers={"authorization": f"Bearer {TOKEN}"}) as http:
            refused = await http.post("/v1/namespaces/team/erasures", json={"user": "  "})
            assert refused.status_code == 400 and "user is empty" in refused.text
            erased = await http.post("/v1/namespaces/team/erasures", json={"user": me})
            assert erased.status_code == 200, erased.text
            assert erased.json()["sessions"] == [session.session_id]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stack.gateway_stub().GetSession(sessions_pb2.GetSessionRequest(session_id=session.session_id),
                                                  metadata=BEARER)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_an_erasure_cut_short_after_each_pass_of_one_is_finished_by_the_next(tmp_path):
    env = {"AGENTMESH_AUTH_TOKENS": TOKEN}
    async with Stack(tmp_path / "home", env=env, services=SERVICES) as stack:
        await _leave_traces(stack, "user:alice", "alice-1")
        await _leave_traces(stack, "user:alice", "alice-2")
        await _leave_traces(stack, "user:bob", "bob-1")
        # Memory's passes of one record, as the gateway drives them, with every service
        # restarted after each (the gateway's own loop cut short): each pass removes what it
        # names, and what is left is found again by the next.
        removed = 0
        for _ in range(3):
            channel = signed_channel(stack.settings.keys_dir, "gateway", "memory", stack.addresses["memory"])
            with acting_as("user:admin"):
                reply = await memory_service_pb2_grpc.MemoryStub(channel).EraseUser(
                    sessions_pb2.EraseUserRequest(namespace="team", user="user:alice", max_items=1))
            await channel.close()
            assert not reply.done and not reply.sessions  # memories and usage go before the sessions
            removed += reply.memories_removed + reply.usage_removed
            await stack.restart()
        assert removed == 5  # one memory and one usage record a pass (4 memories, 2 records in all)
        erased = await stack.gateway_stub().EraseUser(
            sessions_pb2.EraseUserRequest(namespace="team", user="user:alice"), metadata=BEARER)
        assert erased.done and sorted(erased.sessions) == ["alice-1", "alice-2"]
        assert (erased.memories_removed, erased.usage_removed) == (1, 0)
        assert await _readable(stack, "user:alice", "alice-1") == []
        assert await _readable(stack, "user:alice", "alice-2") == []
        assert len(await _readable(stack, "user:bob", "bob-1")) == 9
