"""The tools service's client: its stub, and Execute carried on one stream per process."""

from __future__ import annotations

import grpc
from opentelemetry import trace

from agentmesh.clients.base import DEFAULT_TIMEOUT_S, ServiceClient
from agentmesh.internal.v1 import tools_service_pb2, tools_service_pb2_grpc
from agentmesh.rpc.carried import CarriedClient, CarriedMethod
from agentmesh.rpc.identity import ServiceIdentity

__all__ = ["EXECUTE_METHOD", "ToolsClient"]

EXECUTE_METHOD = "/agentmesh.internal.v1.Tools/Execute"


class ToolsClient(ServiceClient):
    """`carry` (identity and tracer of the calling service, the agent): Execute calls ride one
    long-lived stream (`Tools.CarriedCalls`, agentmesh.rpc.carried), each with its own token,
    CLIENT span, deadline and cancellation; `executes` is None without it (unary calls)."""

    service = "tools"

    def __init__(self, channel: grpc.aio.Channel, target: str = "", *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 carry: tuple[ServiceIdentity | None, trace.Tracer | None] | None = None):
        super().__init__(channel, target, timeout_s=timeout_s)
        self._carrier: CarriedClient | None = None
        self.executes: CarriedMethod[tools_service_pb2.ExecuteRequest, tools_service_pb2.ExecuteResponse] | None = None
        if carry is not None:
            identity, tracer = carry
            self._carrier = CarriedClient(self.stub.CarriedCalls, tools_service_pb2.CarriedToolsCall, identity=identity,
                                          audience="tools", tracer=tracer, peer=self.peer)
            self.executes = self._carrier.method(EXECUTE_METHOD, "execute")

    def _make_stub(self, channel: grpc.aio.Channel) -> tools_service_pb2_grpc.ToolsStub:
        return tools_service_pb2_grpc.ToolsStub(channel)

    async def close(self) -> None:
        """Close the carried calls' stream (the channel is the caller's to close)."""
        if self._carrier is not None:
            await self._carrier.close()
