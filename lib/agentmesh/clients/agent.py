"""The agent service's client (its caller is the gateway)."""

from __future__ import annotations

import grpc

from agentmesh.clients.base import ServiceClient
from agentmesh.internal.v1 import agent_service_pb2_grpc

__all__ = ["AgentClient"]


class AgentClient(ServiceClient):
    service = "agent"

    def _make_stub(self, channel: grpc.aio.Channel) -> agent_service_pb2_grpc.AgentStub:
        return agent_service_pb2_grpc.AgentStub(channel)
