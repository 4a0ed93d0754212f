"""Adapters from the gateway core's ports to its peers over gRPC (memory, agent, tools)."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

import grpc

from agentmesh.errors import Unavailable
from agentmesh.rpc.errors import core_error_from_rpc
from agentmesh.rpc.peers import peer_call
from agentmesh.v1 import (
    agent_pb2,
    agent_pb2_grpc,
    common_pb2,
    gateway_pb2,
    memory_pb2,
    memory_pb2_grpc,
    tools_pb2,
    tools_pb2_grpc,
)

RPC_TIMEOUT_S = 30.0


class MemorySessions:
    def __init__(self, channel: grpc.aio.Channel, target: str):
        self._stub = memory_pb2_grpc.MemoryStub(channel)
        self._target = target

    async def _call(self, method, request):
        return await peer_call(f"the memory service at {self._target}", method(request, timeout=RPC_TIMEOUT_S))

    async def put_session(self, session: gateway_pb2.Session) -> tuple[gateway_pb2.Session, bool]:
        reply = await self._call(self._stub.PutSession, memory_pb2.PutSessionRequest(session=session))
        return reply.session, reply.created

    async def get_session(self, session_id: str) -> gateway_pb2.Session:
        return await self._call(self._stub.GetSession, gateway_pb2.GetSessionRequest(session_id=session_id))

    async def list_sessions(self, page_size: int, page_token: str) -> gateway_pb2.ListSessionsResponse:
        request = gateway_pb2.ListSessionsRequest(page_size=page_size, page_token=page_token)
        return await self._call(self._stub.ListSessions, request)

    async def delete_session(self, session_id: str) -> bool:
        reply = await self._call(self._stub.DeleteSession, gateway_pb2.DeleteSessionRequest(session_id=session_id))
        return reply.deleted

    async def list_messages(self, session_id: str, page_size: int, after_seq: int) -> gateway_pb2.GetTranscriptResponse:
        request = gateway_pb2.GetTranscriptRequest(session_id=session_id, page_size=page_size, after_seq=after_seq)
        return await self._call(self._stub.ListMessages, request)


class AgentClient:
    # A turn waits this long for an agent that is (re)starting before it is refused: a rolling
    # restart should not fail the turns that arrive during it.
    CONNECT_WAIT_S = 10.0

    def __init__(self, channel: grpc.aio.Channel, target: str):
        self._channel = channel
        self._stub = agent_pb2_grpc.AgentStub(channel)
        self._target = target

    async def _connected(self) -> None:
        try:
            await asyncio.wait_for(self._channel.channel_ready(), self.CONNECT_WAIT_S)
        except TimeoutError:
            raise Unavailable(
                f"the agent service at {self._target} is not reachable (waited {self.CONNECT_WAIT_S:.0f}s)"
            ) from None

    async def run_turn(
        self, request: agent_pb2.RunTurnRequest, decisions: "asyncio.Queue[common_pb2.ApprovalDecision]"
    ) -> AsyncIterator[common_pb2.Event]:
        ended = asyncio.Event()

        async def requests():
            # The turn first, then each approval decision on the same stream: it reaches the very
            # agent replica running the turn, with no lookup and no affinity to configure.
            yield request
            # Until the turn ends: an iterator left waiting keeps gRPC's task that reads it
            # pending until the call is garbage-collected ("Task was destroyed but it is pending").
            ending = asyncio.ensure_future(ended.wait())
            try:
                while True:
                    decision = asyncio.ensure_future(decisions.get())
                    done, _ = await asyncio.wait({decision, ending}, return_when=asyncio.FIRST_COMPLETED)
                    if decision not in done:
                        decision.cancel()
                        return
                    yield agent_pb2.RunTurnRequest(decision=decision.result())
            finally:
                ending.cancel()

        await self._connected()
        call = self._stub.RunTurn(requests())
        try:
            async for event in call:
                yield event
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.UNAVAILABLE:
                raise Unavailable(
                    f"the agent service at {self._target} stopped answering; steps completed so far are saved"
                ) from None
            raise core_error_from_rpc(err) from None
        finally:
            ended.set()
            # Leaving early (cancel, client gone) must stop the run on the agent too.
            call.cancel()


class ToolsWorkspaces:
    def __init__(self, channel: grpc.aio.Channel, target: str):
        self._stub = tools_pb2_grpc.ToolsStub(channel)
        self._target = target

    async def delete_workspace(self, session_id: str) -> None:
        request = tools_pb2.DeleteWorkspaceRequest(session_id=session_id)
        await peer_call(f"the tools service at {self._target}", self._stub.DeleteWorkspace(request, timeout=RPC_TIMEOUT_S))
