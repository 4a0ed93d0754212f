"""Indexing conversations is off AppendMessages' path: with the embedder unreachable — so that no
message can be indexed at all — appends are still acknowledged with their seqs and the transcript
holds them, while a search says why it cannot answer. Once the embedder answers (the next start,
here with the built-in one) the watermark catch-up indexes them. The memory service over real
gRPC; no timing is measured."""

from __future__ import annotations

import socket

import grpc
import pytest

from agentmesh.config import Settings
from agentmesh.internal.v1 import memory_service_pb2, memory_service_pb2_grpc
from agentmesh.rpc.launch import start_service
from agentmesh.v1 import common_pb2, learning_pb2, sessions_pb2
from tests.support.identities import signed_channel


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _serving(env: dict[str, str]):
    settings = Settings.from_env(env)
    host = await start_service("memory", settings, "127.0.0.1:0")
    channel = signed_channel(settings.keys_dir, "agent", "memory", host.target)  # as the agent calls it
    return host, channel, memory_service_pb2_grpc.MemoryStub(channel)


async def _stop(host, channel) -> None:
    await channel.close()
    await host.stop(grace=1)
    host.telemetry.shutdown()


async def test_appends_are_acknowledged_whatever_the_index_and_indexed_once_it_can(tmp_path):
    base = {"AGENTMESH_HOME": str(tmp_path / "home"), "AGENTMESH_DRAIN_S": "1"}
    # An embeddings endpoint nobody listens on: every indexing attempt fails.
    down = {**base, "AGENTMESH_EMBEDDER": "openai", "AGENTMESH_EMBEDDINGS_BASE_URL": f"http://127.0.0.1:{_closed_port()}/v1"}
    host, channel, memory = await _serving(down)
    try:
        await memory.PutSession(memory_service_pb2.PutSessionRequest(
            session=sessions_pb2.Session(session_id="s1", namespace="team-a")), timeout=10)
        for n in range(3):
            ack = await memory.AppendMessages(memory_service_pb2.AppendMessagesRequest(session_id="s1", messages=[
                common_pb2.Message(role="user", content=f"Fact number {n}: the gate code is {n}{n}{n}.")]), timeout=10)
            assert ack.last_seq == n + 1
        stored = await memory.ListMessages(sessions_pb2.GetTranscriptRequest(session_id="s1"), timeout=10)
        assert [m.seq for m in stored.messages] == [1, 2, 3]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await memory.SearchConversations(learning_pb2.SearchConversationsRequest(
                namespace="team-a", query="gate code"), timeout=30)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await _stop(host, channel)

    host, channel, memory = await _serving(base)
    try:
        found = await memory.SearchConversations(learning_pb2.SearchConversationsRequest(
            namespace="team-a", query="fact number 1 gate code 111"), timeout=30)
        assert [(h.session_id, h.seq) for h in found.hits][:1] == [("s1", 2)]
    finally:
        await _stop(host, channel)
