"""A service run as its own process (`ServiceHost.serve_forever`, what `agentmesh serve` and a
container run) freezes its start-up heap, so the garbage collector's full passes skip it; one
that cannot listen lets go of what its build opened."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import socket

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentmesh.config import Settings
from agentmesh.rpc.client import open_channel
from agentmesh.rpc.launch import start_service
from agentmesh.rpc.server import PortInUse, ServiceHost
from agentmesh.telemetry import setup_telemetry


async def test_serve_forever_freezes_what_start_up_made(tmp_path):
    settings = Settings.from_env({"AGENTMESH_HOME": str(tmp_path), "AGENTMESH_TRACES": "none"})
    host = ServiceHost("gateway", settings, setup_telemetry("gateway", settings), address="127.0.0.1:0")
    gc.unfreeze()
    serving = asyncio.ensure_future(host.serve_forever())
    try:
        while host.port == 0:
            await asyncio.sleep(0.01)
        async with open_channel(host.target) as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        assert gc.get_freeze_count() > 0
    finally:
        os.kill(os.getpid(), signal.SIGTERM)  # serve_forever's own way out: drain and stop
        await asyncio.wait_for(serving, 30)
        gc.unfreeze()


async def test_a_service_that_cannot_listen_lets_go_of_what_it_opened(tmp_path):
    """The memory service on a taken port fails with PortInUse and releases its embedded store,
    so the same process can start it on another port (a test stack whose picked port another run
    took first; before, the store's lock stayed held and the second start was refused)."""
    settings = Settings.from_env({"AGENTMESH_HOME": str(tmp_path), "AGENTMESH_TRACES": "none"})
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    try:
        with pytest.raises(PortInUse):
            await start_service("memory", settings, f"127.0.0.1:{holder.getsockname()[1]}")
    finally:
        holder.close()
    host = await start_service("memory", settings, "127.0.0.1:0")
    await host.stop(grace=0)
    host.telemetry.shutdown()
