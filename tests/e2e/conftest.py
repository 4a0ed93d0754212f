from __future__ import annotations

import grpc
import pytest

from agentmesh.v1 import gateway_pb2, sessions_pb2
from tests.support.stack import Stack
from tests.support.turns import LiveTurn, collect, kinds, of_kind, wait_until  # noqa: F401 - for the e2e tests


@pytest.fixture
async def stack(tmp_path, llm):
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url) as running:
        yield running


async def chat(stub, session_id: str, message: str, **options) -> list:
    request = gateway_pb2.ChatRequest(session_id=session_id, message=message, options=gateway_pb2.ChatOptions(**options))
    return await collect(stub.Chat(request, timeout=60))


async def transcript(stub, session_id: str) -> list:
    reply = await stub.GetTranscript(sessions_pb2.GetTranscriptRequest(session_id=session_id), timeout=10)
    return list(reply.messages)


async def rpc_error(awaitable) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        result = await awaitable
        if hasattr(result, "__aiter__"):
            await collect(result)
    return info.value

