"""The whole agentmesh stack in the test's event loop: five real gRPC servers on real ports.

    async with Stack(tmp_path, llm_base_url=llm.base_url) as stack:
        gateway = stack.gateway_stub()
        ...
        await stack.restart()  # every service stopped and started again on the same ports

Services start in dependency order on 127.0.0.1:0; each one's address is filled in before
the next is built, so peers find each other exactly as in `agentmesh up`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Mapping

from agentmesh.cli.stack import free_address
from agentmesh.config import SERVICES, Settings
from agentmesh.internal.v1 import memory_service_pb2_grpc, tools_service_pb2_grpc
from agentmesh.rpc.client import open_channel
from agentmesh.rpc.launch import start_service
from agentmesh.rpc.server import PortInUse, ServiceHost
from agentmesh.v1 import gateway_pb2_grpc, scheduler_pb2_grpc
from tests.support.identities import caller_channel

START_ORDER = ("memory", "tools", "agent", "gateway", "scheduler")


def stack_env(home: Path, llm_base_url: str = "", extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {
        "AGENTMESH_HOME": str(home),
        "AGENTMESH_LLM_PROVIDER": "openai" if llm_base_url else "scripted",
        "AGENTMESH_LLM_BASE_URL": llm_base_url,
        "AGENTMESH_LLM_MODEL": "test-model",
        "AGENTMESH_LLM_API_KEY": "sk-test-secret-key-0123456789",
        "AGENTMESH_DRAIN_S": "2",
        "AGENTMESH_TRACES": "local",
        # The gateway's HTTP API on a free port (never the fixed default, shared by parallel runs).
        "AGENTMESH_GATEWAY_HTTP_ADDR": "127.0.0.1:0",
        # Keep retries quick in tests; the provider tests cover backoff itself.
        "AGENTMESH_LLM_MAX_RETRIES": "3",
        "AGENTMESH_AGENT_RETRY_BASE_S": "0.05",
        "AGENTMESH_AGENT_RETRY_MAX_S": "0.5",
        "PATH": "/usr/local/bin:/usr/bin:/bin",
    }
    env.update(extra or {})
    return env


class _Taken(Exception):
    """A service's port, free when it was picked, was taken by another run before the service bound it."""

    def __init__(self, service: str):
        super().__init__(service)
        self.service = service


class Stack:
    def __init__(self, home: Path, llm_base_url: str = "", env: Mapping[str, str] | None = None,
                 services: tuple[str, ...] = START_ORDER):
        self.env = stack_env(Path(home), llm_base_url, env)
        self.services = services
        self.hosts: dict[str, ServiceHost] = {}
        self.addresses: dict[str, str] = dict.fromkeys(SERVICES, "127.0.0.1:0")
        self._channels = []
        self._started: set[str] = set()
        self._settings: tuple[tuple, Settings] | None = None

    @property
    def settings(self) -> Settings:
        # Read for each service started and each channel opened: loaded again only when the
        # environment (a test may change it before a restart) or an address has changed.
        key = (tuple(sorted(self.env.items())), tuple(sorted(self.addresses.items())))
        if self._settings is None or self._settings[0] != key:
            base = Settings.from_env(self.env)
            self._settings = (key, dataclasses.replace(base, addresses=dict(self.addresses)))
        return self._settings[1]

    async def start(self) -> "Stack":
        # Every service gets its port up front, as `agentmesh up` gives them: below the kernel's
        # ephemeral range (free_address), so no other process's outgoing connection or port-0
        # listener takes it while the service is stopped for a restart. (The gateway's HTTP API
        # also needs the scheduler's address before the scheduler starts.)
        for name in self.services:
            if self.addresses[name].endswith(":0"):
                self.addresses[name] = free_address()
        for _ in range(20):
            try:
                for name in self.services:
                    host = await self._start(name)
                    self.hosts[name] = host
                    self.addresses[name] = host.target
                return self
            except _Taken as taken:
                # Another run picked the same free port first. The services started before this one
                # were given its old address (the agent calls the gateway, the gateway the scheduler):
                # they start again with the new one, or a call of theirs would reach the other run.
                await self._stop_hosts(grace=0)  # nothing of theirs has run yet
                self.addresses[taken.service] = free_address()
        raise RuntimeError("no free ports for the stack after 20 tries")

    async def _start(self, name: str) -> ServiceHost:
        """`name` on its address. On a first start a port another run took first is `_Taken`; a
        restart, which must keep its port, tries again while the other holder lets go."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while True:
            try:
                host = await start_service(name, self.settings, self.addresses[name])
            except PortInUse:
                if name not in self._started:
                    raise _Taken(name) from None
                if loop.time() > deadline:
                    raise
                await asyncio.sleep(0.2)
                continue
            self._started.add(name)
            return host

    async def stop(self) -> None:
        for channel in self._channels:
            await channel.close()
        self._channels.clear()
        await self._stop_hosts()

    async def _stop_hosts(self, grace: float = 1) -> None:
        for name in reversed(self.services):
            host = self.hosts.pop(name, None)
            if host is not None:
                await host.stop(grace=grace)
                host.telemetry.shutdown()

    async def restart(self) -> None:
        """Stop every service and start each again on the same port and data."""
        await self.stop()
        await self.start()

    async def __aenter__(self) -> "Stack":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    def channel(self, service: str):
        """A channel as `service`'s usual caller: signed as the agent for memory and tools, as
        the gateway for the agent; a user's plain channel to the gateway and the scheduler."""
        channel = caller_channel(self.settings.keys_dir, service, self.addresses[service])
        self._channels.append(channel)
        return channel

    def user_channel(self, service: str):
        """A plain channel to `service`, as a user's client (the CLI, an SDK) opens it."""
        channel = open_channel(self.addresses[service])
        self._channels.append(channel)
        return channel

    @property
    def http_url(self) -> str:
        """The gateway's HTTP API and web console, e.g. http://127.0.0.1:41234"""
        return f"http://{self.hosts['gateway'].endpoints['http']}"

    def gateway_stub(self) -> gateway_pb2_grpc.GatewayStub:
        return gateway_pb2_grpc.GatewayStub(self.channel("gateway"))

    def memory_stub(self) -> memory_service_pb2_grpc.MemoryStub:
        return memory_service_pb2_grpc.MemoryStub(self.channel("memory"))

    def tools_stub(self) -> tools_service_pb2_grpc.ToolsStub:
        return tools_service_pb2_grpc.ToolsStub(self.channel("tools"))

    def scheduler_stub(self) -> scheduler_pb2_grpc.SchedulerStub:
        return scheduler_pb2_grpc.SchedulerStub(self.channel("scheduler"))
