"""The memory service on a real port, over real gRPC, on a fresh AGENTMESH_HOME per test.

    async def test_x(memory_service):
        client = memory_service.client          # agentmesh.memory.client.MemoryClient
        stub = memory_service.stub              # the raw Memory stub, for status codes
        await memory_service.restart()          # stop, then start again on the same home
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import pytest

from agentmesh.config import Settings
from agentmesh.memory.client import MemoryClient
from agentmesh.rpc.client import open_channel
from agentmesh.rpc.launch import start_service
from agentmesh.rpc.server import ServiceHost


class MemoryService:
    def __init__(self, home: Path, env: Mapping[str, str] | None = None):
        self.env = {"AGENTMESH_HOME": str(home), "AGENTMESH_TRACES": "local", "AGENTMESH_DRAIN_S": "1", **(env or {})}
        self.host: ServiceHost | None = None
        self._channel = None
        self.client: MemoryClient
        self.stub = None

    async def start(self) -> "MemoryService":
        self.host = await start_service("memory", Settings.from_env(self.env), "127.0.0.1:0")
        self._channel = open_channel(self.host.target)
        self.client = MemoryClient(self._channel, target=self.host.target)
        self.stub = self.client.stub
        return self

    async def stop(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
        if self.host is not None:
            await self.host.stop(grace=1)
            self.host.telemetry.shutdown()
            self.host = None

    async def restart(self, env: Mapping[str, str] | None = None) -> None:
        await self.stop()
        self.env.update(env or {})
        await self.start()


@pytest.fixture
async def memory_service(tmp_path):
    service = await MemoryService(tmp_path / "home").start()
    try:
        yield service
    finally:
        await service.stop()


@pytest.fixture
async def make_memory_service(tmp_path):
    """Start services with a custom environment: `await make_memory_service({...})`."""
    started: list[MemoryService] = []

    async def make(env: Mapping[str, str] | None = None, home: Path | None = None) -> MemoryService:
        service = await MemoryService(home or tmp_path / "home", env).start()
        started.append(service)
        return service

    try:
        yield make
    finally:
        for service in started:
            await service.stop()
