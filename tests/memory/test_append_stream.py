"""Transcript appends carried on one long-lived stream (Memory.AppendStream, agentmesh.rpc.carried):
each carried append is a call in all but transport — its own token checked, its own spans and
status — and the stream is reopened after it breaks."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest

from agentmesh.clients.memory import MemoryClient
from agentmesh.config import Settings
from agentmesh.errors import PermissionDenied, Unauthenticated, Unavailable
from agentmesh.internal.v1 import memory_service_pb2, memory_service_pb2_grpc
from agentmesh.rpc.auth import current_principal
from agentmesh.rpc.identity import Principal, ServiceIdentity
from agentmesh.telemetry.spanstore import read_spans, span_store_dir
from agentmesh.v1 import common_pb2
from tests.memory.conftest import Carrying
from tests.support.identities import signed_channel


def _step(text: str) -> list[common_pb2.Message]:
    return [common_pb2.Message(role="user", content=text)]


async def test_carried_appends_land_in_order_and_concurrent_sessions_do_not_mix(memory_service, carrying):
    for session in ("a", "b"):
        await memory_service.client.put_session(session)

    async def write(session: str) -> list[int]:
        return [await carrying.client.append_messages(session, _step(f"{session}{i}")) for i in range(20)]

    seqs_a, seqs_b = await asyncio.gather(write("a"), write("b"))
    assert seqs_a == list(range(1, 21)) and seqs_b == list(range(1, 21))
    for session in ("a", "b"):
        stored = [m.content for m in await memory_service.client.transcript(session)]
        assert stored == [f"{session}{i}" for i in range(20)]
    assert carrying.client.carrying_appends


async def test_each_carried_append_is_checked_as_a_call(memory_service):
    await memory_service.client.put_session("s")
    # The tools service may not append to transcripts: refused per call, on an open stream.
    tools = Carrying(memory_service, caller="tools")
    try:
        with pytest.raises(PermissionDenied, match="only the agent service may"):
            await tools.client.append_messages("s", _step("forged"))
    finally:
        await tools.close()
    assert [m.content for m in await memory_service.client.transcript("s")] == []


async def test_a_carried_call_with_a_bad_token_is_refused_and_the_stream_serves_the_next(memory_service, carrying):
    await memory_service.client.put_session("s")
    # A stream the agent opened (its channel signs the stream itself); each message carries its own token.
    stream = memory_service_pb2_grpc.MemoryStub(carrying.channel).AppendStream()
    good = ServiceIdentity.open("agent", Settings.from_env(memory_service.env).keys_dir).token("memory")

    async def send(call_id: int, token: str, text: str) -> memory_service_pb2.AppendStreamResponse:
        await stream.write(memory_service_pb2.AppendStreamRequest(
            call=common_pb2.CarriedCall(id=call_id, service_token=token),
            request=memory_service_pb2.AppendMessagesRequest(session_id="s", messages=_step(text))))
        return await asyncio.wait_for(stream.read(), 5)

    forged = await send(1, "not-a-token", "forged")
    assert (forged.status.id, forged.status.code) == (1, grpc.StatusCode.UNAUTHENTICATED.value[0])
    assert "refused" in forged.status.message
    missing = await send(2, "", "unsigned")
    assert missing.status.code == grpc.StatusCode.UNAUTHENTICATED.value[0]
    accepted = await send(3, good, "one")
    assert (accepted.status.id, accepted.status.code, accepted.response.last_seq) == (3, 0, 1)
    stream.cancel()
    assert [m.content for m in await memory_service.client.transcript("s")] == ["one"]


async def test_without_any_token_the_stream_is_not_opened(memory_service):
    channel = grpc.aio.insecure_channel(memory_service.host.target)
    try:
        stream = memory_service_pb2_grpc.MemoryStub(channel).AppendStream()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stream.read()
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        await channel.close()


async def test_each_carried_append_has_its_own_client_and_server_span(tmp_path, make_memory_service):
    from agentmesh.telemetry import setup_telemetry

    service = await make_memory_service()
    await service.client.put_session("s")
    settings = Settings.from_env(service.env)
    telemetry = setup_telemetry("agent", settings)
    channel = signed_channel(settings.keys_dir, "agent", "memory", service.host.target)
    client = MemoryClient(channel, carry=(ServiceIdentity.open("agent", settings.keys_dir),
                                                  telemetry.tracer_provider.get_tracer("agentmesh.rpc")))
    try:
        tracer = telemetry.tracer_provider.get_tracer("test")
        with tracer.start_as_current_span("turn") as turn:
            # Each for the user its turn runs for, though one stream carries both.
            for user, text in (("user:alice", "one"), ("user:bob", "two")):
                acting = current_principal.set(Principal(subject=user))
                try:
                    await client.append_messages("s", _step(text))
                finally:
                    current_principal.reset(acting)
        trace_id = format(turn.get_span_context().trace_id, "032x")
    finally:
        await client.close()
        await channel.close()
        telemetry.shutdown()
    service.host.telemetry.force_flush()
    spans = [s for s in read_spans(span_store_dir(settings.home)) if s["trace_id"] == trace_id]
    clients = [s for s in spans if s["kind"] == "CLIENT" and s["name"] == "/agentmesh.internal.v1.Memory/AppendMessages"]
    servers = [s for s in spans if s["kind"] == "SERVER" and s["name"] == "/agentmesh.internal.v1.Memory/AppendMessages"]
    assert len(clients) == 2 and len(servers) == 2, json.dumps(spans, indent=1)
    assert {s["parent_span_id"] for s in servers} == {c["span_id"] for c in clients}
    assert all(s["attributes"]["rpc.grpc.status_code"] == 0 for s in servers)
    assert [s["attributes"]["enduser.id"] for s in sorted(servers, key=lambda s: s["start"])] == ["user:alice", "user:bob"]
    # The stream itself is in no trace.
    assert not [s for s in read_spans(span_store_dir(settings.home)) if "AppendStream" in s["name"]]


async def test_a_restarted_memory_service_gets_the_next_append_on_a_new_stream(memory_service, carrying):
    await memory_service.client.put_session("s")
    await carrying.client.append_messages("s", _step("before"))
    target = memory_service.host.target
    await memory_service.host.stop(grace=1)
    with pytest.raises((Unavailable, Unauthenticated)):
        await carrying.client.append_messages("s", _step("while away"))
    # Back on the same address: the next append opens a new stream and lands.
    memory_service.env["AGENTMESH_MEMORY_ADDR"] = target
    from agentmesh.rpc.launch import start_service

    memory_service.host = await start_service("memory", Settings.from_env(memory_service.env), target)
    for _ in range(50):
        try:
            await carrying.client.append_messages("s", _step("after"))
            break
        except Unavailable:
            await asyncio.sleep(0.1)
    stored = [m.content for m in await memory_service.client.transcript("s")]
    assert stored[0] == "before" and stored[-1] == "after" and "while away" not in stored


async def test_a_request_too_large_to_carry_goes_as_a_unary_call(memory_service, carrying):
    from agentmesh.rpc.carried import CARRY_LIMIT_BYTES

    await memory_service.client.put_session("s")
    big = "x" * (CARRY_LIMIT_BYTES + 1)
    assert await carrying.client.append_messages("s", _step(big)) == 1
    assert [len(m.content) for m in await memory_service.client.transcript("s")] == [len(big)]
