"""Retention over the real services (docs/memory.md#retention): memory, tools and the gateway on
real ports, the sweep asked of the gateway as the scheduler's leader asks it.

The clock is the sweep's `now` (SweepRetention's request field, the scheduler's clock): records
are written now, and the sweep measures their age to an instant 40 days on; "fresh" records are
written with times 39 days on (memory accepts a created_at up to a year ahead), so a 30-day
retention removes the first and keeps the second. The leader test writes records 40 days old
instead and lets the scheduler sweep on its own clock.
"""

from __future__ import annotations

import asyncio
import json
import time

import grpc
import pytest

from agentmesh.internal.v1 import memory_service_pb2, memory_service_pb2_grpc
from agentmesh.rpc.auth import current_principal
from agentmesh.rpc.identity import Principal
from agentmesh.v1 import common_pb2, gateway_pb2, learning_pb2, sessions_pb2, tools_pb2
from tests.memory.test_erasure import indexed_conversations
from tests.support.identities import signed_channel
from tests.support.stack import Stack

DAY = 86400.0
SERVICES = ("memory", "tools", "gateway")
T0 = time.time()
LATER = T0 + 40 * DAY   # the sweep's now
FRESH = T0 + 39 * DAY   # a day old then


def _retention(transcripts=0, memories=0, usage=0, workspaces=0) -> sessions_pb2.Retention:
    return sessions_pb2.Retention(transcripts_days=transcripts, memories_days=memories, usage_days=usage,
                                  workspaces_days=workspaces)


async def _set_retention(gateway, namespace: str, retention: sessions_pb2.Retention) -> None:
    await gateway.UpdateNamespaceSettings(sessions_pb2.UpdateNamespaceSettingsRequest(
        namespace=namespace, retention=retention))


async def _session(stack: Stack, session_id: str, namespace: str, created_at: float = 0.0, *,
                   message: str = "", workspace: bool = True) -> None:
    memory, gateway = stack.memory_stub(), stack.gateway_stub()
    await memory.PutSession(memory_service_pb2.PutSessionRequest(session=sessions_pb2.Session(
        session_id=session_id, namespace=namespace, created_at=created_at)))
    if message:
        await memory.AppendMessages(memory_service_pb2.AppendMessagesRequest(
            session_id=session_id, messages=[common_pb2.Message(role="user", content=message)]))
    if workspace:
        await gateway.WriteWorkspaceFile(tools_pb2.WriteWorkspaceFileRequest(
            session_id=session_id, path="notes.txt", content=b"kept in the workspace"))


async def _memory(stack: Stack, namespace: str, text: str, created_at: float = 0.0) -> None:
    await stack.memory_stub().Remember(memory_service_pb2.RememberRequest(namespace=namespace, text=text, created_at=created_at))


async def _usage(stack: Stack, record_id: str, namespace: str, session_id: str, at: float) -> None:
    await stack.memory_stub().RecordUsage(memory_service_pb2.RecordUsageRequest(records=[memory_service_pb2.UsageRecord(
        id=record_id, at=at, session_id=session_id, namespace=namespace, model_name="default", model="m",
        provider="scripted", input_tokens=10, output_tokens=5)]))


async def _memories(stack: Stack, namespace: str) -> list[str]:
    reply = await stack.memory_stub().ListMemories(memory_service_pb2.ListMemoriesRequest(namespace=namespace, page_size=1000))
    return sorted(m.text for m in reply.memories)


async def _usage_ids(stack: Stack) -> list[str]:
    # SumUsage by session names the sessions that still have records (the gateway's call).
    channel = signed_channel(stack.settings.keys_dir, "gateway", "memory", stack.addresses["memory"])
    reply = await memory_service_pb2_grpc.MemoryStub(channel).SumUsage(memory_service_pb2.SumUsageRequest(start=0, end=T0 + 400 * DAY,
                                                                          group_by="session"))
    await channel.close()
    return sorted(s.key for s in reply.sums)


async def _exists(stack: Stack, session_id: str) -> bool:
    try:
        await stack.gateway_stub().GetSession(sessions_pb2.GetSessionRequest(session_id=session_id))
    except grpc.aio.AioRpcError as err:
        assert err.code() == grpc.StatusCode.NOT_FOUND
        return False
    return True


def _workspace(stack: Stack, session_id: str):
    return stack.settings.home / "workspaces" / session_id


async def test_one_sweep_removes_what_expired_and_keeps_the_rest(tmp_path):
    async with Stack(tmp_path / "home", services=SERVICES) as stack:
        gateway = stack.gateway_stub()
        await _session(stack, "old", "ret", message="an old conversation")
        await _session(stack, "new", "ret", created_at=FRESH)
        await _session(stack, "elsewhere", "other", message="no retention here")
        await _memory(stack, "ret", "the old fact")
        await _memory(stack, "ret", "the fresh fact", created_at=FRESH)
        await _memory(stack, "other", "kept for ever")
        await _usage(stack, "u-old", "ret", "old", T0)
        await _usage(stack, "u-new", "ret", "new", FRESH)
        await _usage(stack, "u-other", "other", "elsewhere", T0)
        await _set_retention(gateway, "ret", _retention(transcripts=30, memories=30, usage=30))
        assert _workspace(stack, "old").is_dir()
        recalled = await gateway.SearchConversations(learning_pb2.SearchConversationsRequest(
            namespace="ret", query="an old conversation"))
        assert [h.session_id for h in recalled.hits] == ["old"]

        reply = await gateway.SweepRetention(gateway_pb2.SweepRetentionRequest(now=LATER))

        assert reply.done
        assert (reply.sessions_removed, reply.memories_removed, reply.usage_removed) == (1, 1, 1)
        assert not await _exists(stack, "old") and not _workspace(stack, "old").exists()
        recalled = await gateway.SearchConversations(learning_pb2.SearchConversationsRequest(
            namespace="ret", query="an old conversation"))
        assert [h.session_id for h in recalled.hits] == []  # nor found by recall over conversations
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await gateway.GetTranscript(sessions_pb2.GetTranscriptRequest(session_id="old"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert await _exists(stack, "new") and _workspace(stack, "new").is_dir()
        assert await _exists(stack, "elsewhere") and _workspace(stack, "elsewhere").is_dir()
        assert await _memories(stack, "ret") == ["the fresh fact"]
        assert await _memories(stack, "other") == ["kept for ever"]
        assert await _usage_ids(stack) == ["elsewhere", "new"]
        settings = await gateway.GetNamespaceSettings(sessions_pb2.GetNamespaceSettingsRequest(namespace="ret"))
        assert settings.retention == _retention(transcripts=30, memories=30, usage=30)
    # The expired session's messages are gone from the conversation index on disk too.
    assert await indexed_conversations(tmp_path / "home", "ret") == []
    assert await indexed_conversations(tmp_path / "home", "other") == ["elsewhere"]
    # What went, as the gateway counted it (its metric points, written locally when it stopped).
    removed: dict[str, float] = {}
    for path in (tmp_path / "home" / "metrics").glob("gateway-*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row["name"] == "agentmesh.retention.removed" and row["attributes"]["reason"] == "retention":
                kind = row["attributes"]["kind"]
                removed[kind] = max(removed.get(kind, 0), row["value"])  # a cumulative counter
    assert removed == {"sessions": 1, "workspaces": 1, "memories": 1, "usage": 1}


async def test_passes_of_one_record_survive_a_restart_between_each(tmp_path):
    async with Stack(tmp_path / "home", services=SERVICES) as stack:
        for i in range(3):
            await _session(stack, f"old-{i}", "ret", created_at=T0 + i, message=f"conversation {i}")
            await _memory(stack, "ret", f"old fact {i}")
            await _usage(stack, f"u-{i}", "ret", f"old-{i}", T0 + i)
            await _session(stack, f"ws-{i}", "ws", created_at=T0 + i)
        await _session(stack, "keep", "ret", created_at=FRESH)
        await _set_retention(stack.gateway_stub(), "ret", _retention(transcripts=30, memories=30, usage=30))
        await _set_retention(stack.gateway_stub(), "ws", _retention(workspaces=30))

        passes, removed = 0, {"sessions": 0, "workspaces": 0, "memories": 0, "usage": 0}
        while True:
            reply = await stack.gateway_stub().SweepRetention(
                gateway_pb2.SweepRetentionRequest(now=LATER, max_items=1, max_passes=1))
            passes += 1
            for kind in removed:
                removed[kind] += getattr(reply, f"{kind}_removed")
            await stack.restart()  # the sweep's place is memory's, kept across the restart
            if reply.done:
                break
            assert passes < 50, "the sweep made no progress"

        assert passes > 3  # one record per pass: the work really was spread over passes
        assert removed == {"sessions": 3, "workspaces": 6, "memories": 3, "usage": 3}
        assert [await _exists(stack, f"old-{i}") for i in range(3)] == [False] * 3
        assert await _exists(stack, "keep")
        assert await _memories(stack, "ret") == [] and await _usage_ids(stack) == []
        # Workspace-only retention: the workspaces went, the sessions stay...
        for i in range(3):
            assert await _exists(stack, f"ws-{i}") and not _workspace(stack, f"ws-{i}").exists()
        # ...and a later sweep does not remove them again.
        again = await stack.gateway_stub().SweepRetention(gateway_pb2.SweepRetentionRequest(now=LATER + DAY))
        assert again.done and again.workspaces_removed == 0


async def test_the_scheduler_leader_sweeps_on_its_own(tmp_path):
    env = {"AGENTMESH_RETENTION_SWEEP_S": "0.2"}
    async with Stack(tmp_path / "home", env=env, services=(*SERVICES, "scheduler")) as stack:
        await _session(stack, "ancient", "ret", created_at=T0 - 40 * DAY)
        await _memory(stack, "ret", "an ancient fact", created_at=T0 - 40 * DAY)
        await _memory(stack, "ret", "a recent fact")
        await _set_retention(stack.gateway_stub(), "ret", _retention(transcripts=30, memories=30))
        while await _exists(stack, "ancient") or len(await _memories(stack, "ret")) > 1:
            await asyncio.sleep(0.1)  # the leader's next sweep; the test's own timeout bounds the wait
        assert await _memories(stack, "ret") == ["a recent fact"]


async def test_bad_retention_requests_are_refused_and_change_nothing(tmp_path):
    async with Stack(tmp_path / "home", services=SERVICES) as stack:
        gateway = stack.gateway_stub()
        await _set_retention(gateway, "ret", _retention(memories=7))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _set_retention(gateway, "ret", _retention(memories=-1))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "retention.memories_days must be between 0 (keep) and 36500 days" in err.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await gateway.SweepRetention(gateway_pb2.SweepRetentionRequest(namespace="ret", max_items=-5))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "max_items must be between 0 and 10000" in err.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await gateway.SweepRetention(gateway_pb2.SweepRetentionRequest(namespace="Bad Name!"))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # The policy alone, as clients older than retention send it: the retention stays.
        await gateway.UpdateNamespaceSettings(sessions_pb2.UpdateNamespaceSettingsRequest(
            namespace="ret", tools=common_pb2.ToolPolicy(deny=["shell"])))
        settings = await gateway.GetNamespaceSettings(sessions_pb2.GetNamespaceSettingsRequest(namespace="ret"))
        assert settings.retention == _retention(memories=7)


async def test_under_a_tenant_policy_the_leader_sweeps_each_tenants_namespaces(tmp_path):
    # No principal is in every tenant: the leader's sweep signs each namespace's passes as an
    # admin of the tenant owning it (gateway/retention.py), and memory checks them as usual.
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"tenants": {"acme": {"namespaces": ["acme"]}, "beta": {"namespaces": ["beta"]}}}))
    env = {"AGENTMESH_RETENTION_SWEEP_S": "0.2", "AGENTMESH_AUTH_POLICY": str(policy)}
    async with Stack(tmp_path / "home", env=env, services=(*SERVICES, "scheduler")) as stack:
        as_gateway = memory_service_pb2_grpc.MemoryStub(
            signed_channel(stack.settings.keys_dir, "gateway", "memory", stack.addresses["memory"]))
        for namespace in ("acme", "beta"):
            token = current_principal.set(Principal(subject="oidc:admin", tenant=f"{namespace}=admin"))
            try:
                await stack.memory_stub().Remember(memory_service_pb2.RememberRequest(
                    namespace=namespace, text=f"an ancient {namespace} fact", created_at=T0 - 40 * DAY))
                await stack.memory_stub().Remember(memory_service_pb2.RememberRequest(
                    namespace=namespace, text=f"a recent {namespace} fact"))
                await as_gateway.UpdateNamespaceSettings(sessions_pb2.UpdateNamespaceSettingsRequest(
                    namespace=namespace, retention=_retention(memories=30)))
            finally:
                current_principal.reset(token)

        async def left(namespace: str) -> list[str]:
            token = current_principal.set(Principal(subject="oidc:admin", tenant=f"{namespace}=admin"))
            try:
                return await _memories(stack, namespace)
            finally:
                current_principal.reset(token)

        while len(await left("acme")) > 1 or len(await left("beta")) > 1:
            await asyncio.sleep(0.1)  # the leader's next sweep; the test's own timeout bounds the wait
        assert await left("acme") == ["a recent acme fact"] and await left("beta") == ["a recent beta fact"]
