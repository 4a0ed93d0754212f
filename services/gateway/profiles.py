"""`GetProfile` / `SetProfile` through the gateway: a namespace's standing instructions, kept by
the memory service (docs/agent.md, "Standing instructions"). The gateway passes them on under its
own service token, on behalf of the user who called."""

from __future__ import annotations

import grpc

from agentmesh.errors import Unavailable
from agentmesh.rpc.errors import core_error_from_rpc
from agentmesh.v1 import learning_pb2, memory_pb2_grpc


class MemoryProfiles:
    def __init__(self, channel: grpc.aio.Channel, target: str, timeout_s: float = 30.0):
        self._stub = memory_pb2_grpc.MemoryStub(channel)
        self._target = target
        self._timeout_s = timeout_s

    async def _call(self, method, request) -> learning_pb2.Profile:
        try:
            return await method(request, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as err:
            if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise Unavailable(f"the memory service at {self._target} did not answer "
                                  f"({err.details() or err.code().name})") from None
            raise core_error_from_rpc(err) from None

    async def get(self, request: learning_pb2.GetProfileRequest) -> learning_pb2.Profile:
        return await self._call(self._stub.GetProfile, request)

    async def set(self, request: learning_pb2.SetProfileRequest) -> learning_pb2.Profile:
        return await self._call(self._stub.SetProfile, request)
