"""The gateway's and the scheduler's clients: the public API, for the command line, the
scheduler's runs, a gateway replica forwarding to the session's owner, the HTTP API."""

from __future__ import annotations

import grpc

from agentmesh.clients.base import ServiceClient
from agentmesh.v1 import gateway_pb2_grpc, scheduler_pb2_grpc

__all__ = ["GatewayClient", "SchedulerClient"]


class GatewayClient(ServiceClient):
    service = "gateway"

    def _make_stub(self, channel: grpc.aio.Channel) -> gateway_pb2_grpc.GatewayStub:
        return gateway_pb2_grpc.GatewayStub(channel)


class SchedulerClient(ServiceClient):
    service = "scheduler"

    def _make_stub(self, channel: grpc.aio.Channel) -> scheduler_pb2_grpc.SchedulerStub:
        return scheduler_pb2_grpc.SchedulerStub(channel)
