"""A host says SERVING only once it has started everything it serves: `agentmesh up` and a
readiness probe wait for that before they send anyone to the service (the gateway's HTTP
listener is started by a start callback, after the gRPC port is open)."""

from __future__ import annotations

import asyncio

from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentmesh.config import Settings
from agentmesh.rpc.client import open_channel
from agentmesh.rpc.server import ServiceHost
from agentmesh.telemetry import setup_telemetry


async def test_the_server_is_not_serving_while_its_start_callbacks_run(tmp_path):
    settings = Settings.from_env({"AGENTMESH_HOME": str(tmp_path), "AGENTMESH_TRACES": "none"})
    host = ServiceHost("tools", settings, setup_telemetry("tools", settings), address="127.0.0.1:0")
    started, release = asyncio.Event(), asyncio.Event()

    async def slow_listener() -> None:
        started.set()
        await release.wait()

    host.on_start(slow_listener)
    starting = asyncio.create_task(host.start())
    await started.wait()  # the gRPC port is open, the callback has not finished
    channel = open_channel(f"127.0.0.1:{host.port}")
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
        release.set()
        await starting
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        release.set()
        await channel.close()
        await host.stop(grace=0)
        host.telemetry.shutdown()
