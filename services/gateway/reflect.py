"""`Reflect` through the gateway: users (`agentmesh reflect SESSION`) and the scheduler's idle
reflections reach the agent's Reflect here, the one door to the agent (docs/agent.md, "Reflection")."""

from __future__ import annotations

import grpc

from agentmesh.clients.agent import AgentClient
from agentmesh.errors import Unavailable
from agentmesh.rpc.errors import core_error_from_rpc
from agentmesh.v1 import learning_pb2

# A reflection is one model call over up to a long transcript: give it the time a slow model needs.
REFLECT_TIMEOUT_S = 300.0


class AgentReflect:
    def __init__(self, client: AgentClient):
        self._stub = client.stub
        self._target = client.target

    async def reflect(self, request: learning_pb2.ReflectRequest) -> learning_pb2.ReflectResponse:
        try:
            return await self._stub.Reflect(request, timeout=REFLECT_TIMEOUT_S, wait_for_ready=True)
        except grpc.aio.AioRpcError as err:
            if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise Unavailable(f"the agent service at {self._target} did not answer "
                                  f"({err.details() or err.code().name})") from None
            raise core_error_from_rpc(err) from None
