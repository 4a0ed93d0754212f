"""StartTurn carried beside the appends on the agent's one stream to memory
(Memory.CarriedCalls, agentmesh.rpc.carried): each a call in all but transport — checked as
StartTurn, answered as StartTurn — with its answer bounded as a carried request is."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from agentmesh.agent.adapters.memory import GrpcTurnStart
from agentmesh.agent.types import ChatMessage
from agentmesh.config import Settings
from agentmesh.internal.v1 import memory_service_pb2
from agentmesh.rpc.carried import CARRY_LIMIT_BYTES, NOT_CARRIED_HERE
from agentmesh.rpc.identity import ServiceIdentity
from agentmesh.v1 import common_pb2
from tests.memory.conftest import Carrying
from tests.support.recording import recording_channel


def _user(text: str) -> common_pb2.Message:
    return common_pb2.Message(role="user", content=text)


def _start(session_id: str, text: str, **kw) -> memory_service_pb2.StartTurnRequest:
    return memory_service_pb2.StartTurnRequest(session_id=session_id, messages=[_user(text)], **kw)


async def test_start_turn_and_appends_ride_one_stream(memory_service, carrying):
    await memory_service.client.put_session("s")
    await memory_service.client.append_messages("s", [_user("before")])

    reply = await carrying.client.start_turn(_start("s", "hello"), timeout=5)
    assert [m.content for m in reply.messages] == ["before"] and (reply.first_seq, reply.last_seq) == (2, 2)
    assert await carrying.client.append_messages("s", [_user("step")]) == 3
    again = await carrying.client.start_turn(_start("s", "next"), timeout=5)
    assert [m.content for m in again.messages] == ["before", "hello", "step"]

    # One stream carried all four: no unary StartTurn or AppendMessages was made.
    assert carrying.made == ["/agentmesh.internal.v1.Memory/CarriedCalls"]
    assert carrying.client.carrying_turn_starts and carrying.client.carrying_appends
    stored = [m.content for m in await memory_service.client.transcript("s")]
    assert stored == ["before", "hello", "step", "next"]


async def test_a_carried_start_turn_is_checked_as_a_start_turn(memory_service):
    await memory_service.client.put_session("s")
    tools = Carrying(memory_service, caller="tools")
    try:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await tools.client.start_turn(_start("s", "forged"), timeout=5)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "only the agent service may" in refused.value.details()
        assert tools.made == ["/agentmesh.internal.v1.Memory/CarriedCalls"]  # refused on the stream, not as a unary call
    finally:
        await tools.close()
    assert await memory_service.client.transcript("s") == []


async def test_a_carried_start_turn_answer_is_bounded_and_the_turn_reads_the_rest(memory_service, carrying):
    await memory_service.client.put_session("long")
    chunk = "y" * 20_000
    for i in range(30):  # ~600 KB of transcript, more than one carried answer may hold
        await memory_service.client.append_messages("long", [_user(f"{i}:{chunk}")])

    reply = await carrying.client.start_turn(_start("long", "first"), timeout=10)
    assert reply.ByteSize() <= CARRY_LIMIT_BYTES
    assert 1 <= len(reply.messages) < 30 and reply.next_after_seq == reply.messages[-1].seq
    assert (reply.first_seq, reply.last_seq) == (31, 31)

    # The agent's adapter pages the rest (ListMessages) and sees the whole transcript.
    began = await GrpcTurnStart(carrying.client, memory_service.host.target).start(
        "long", [ChatMessage(role="user", content="second")], namespace="", query="", k=0, recall_timeout_s=0)
    assert [m.content.split(":")[0] for m in began.stored] == [str(i) for i in range(30)] + ["first"]
    assert "/agentmesh.internal.v1.Memory/StartTurn" not in carrying.made


async def test_a_call_of_a_method_the_server_does_not_carry_is_answered_unimplemented_alone(memory_service):
    await memory_service.client.put_session("s")
    keys = Settings.from_env(memory_service.env).keys_dir
    channel, _ = recording_channel(keys, "agent", "memory", memory_service.host.target)
    token = ServiceIdentity.open("agent", keys).token("memory")
    # A newer caller's message: a request field (15) this server's messages do not have.
    stream = channel.stream_stream("/agentmesh.internal.v1.Memory/CarriedCalls", request_serializer=lambda raw: raw,
                                   response_deserializer=memory_service_pb2.CarriedMemoryAnswer.FromString)()
    try:
        header = memory_service_pb2.CarriedMemoryCall(call=common_pb2.CarriedCall(id=7, service_token=token))
        await stream.write(header.SerializeToString() + b"\x7a\x00")
        unknown = await asyncio.wait_for(stream.read(), 5)
        assert (unknown.status.id, unknown.status.code) == (7, grpc.StatusCode.UNIMPLEMENTED.value[0])
        assert unknown.status.message == NOT_CARRIED_HERE
        # The stream still serves what it knows.
        known = memory_service_pb2.CarriedMemoryCall(call=common_pb2.CarriedCall(id=8, service_token=token),
                                             start_turn=_start("s", "hi"))
        await stream.write(known.SerializeToString())
        answer = await asyncio.wait_for(stream.read(), 5)
        assert (answer.status.id, answer.status.code, answer.start_turn.last_seq) == (8, 0, 1)
    finally:
        stream.cancel()
        await channel.close()


