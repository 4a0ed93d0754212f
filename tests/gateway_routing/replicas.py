"""Several gateway replicas in the test's event loop, in front of one stack's agent, tools and
memory, each told the others' addresses (AGENTMESH_GATEWAY_PEERS) and its own."""

from __future__ import annotations

import collections
import dataclasses
from typing import Mapping

import grpc

from agentmesh.cli.stack import free_address
from agentmesh.config import Settings
from agentmesh.gateway import wiring as gateway_server
from agentmesh.gateway.membership import resolve_addresses
from agentmesh.gateway.routing import owner_of
from agentmesh.rpc.client import open_channel
from agentmesh.rpc.server import PortInUse, ServiceHost
from agentmesh.telemetry import setup_telemetry
from agentmesh.v1 import gateway_pb2_grpc
from tests.support.stack import Stack
from tests.support.turns import wait_until

BACKENDS = ("memory", "tools", "agent")


class FakeDNS:
    """Stands in for a headless Service's DNS answer, which the test changes as pods come and
    go. Counts each replica's lookups, so a test can wait until every one has seen a change."""

    NAME = "dns:///gateway-peers.test:50051"

    def __init__(self, answer: list[str]):
        self.answer = list(answer)
        self.lookups: collections.Counter = collections.Counter()

    def resolver_for(self, index: int):
        async def resolve(name: str, port: int) -> list[str]:
            self.lookups[index] += 1
            return list(self.answer)
        return resolve

    async def change(self, answer: list[str], indexes) -> None:
        """Answer `answer` from now on; return once each replica finished a lookup of it."""
        self.answer = list(answer)
        start = {i: self.lookups[i] for i in indexes}
        # The second lookup after the change starts only once the first one was applied.
        await wait_until(lambda: all(self.lookups[i] >= start[i] + 2 for i in indexes))


class Replicas:
    def __init__(self, stack: Stack, count: int = 2, env: Mapping[str, str] | None = None,
                 peers: Mapping[int, list[int]] | None = None, dns: FakeDNS | None = None):
        """`peers` overrides which replicas (by index) a replica lists, to make them disagree;
        `dns` makes every replica find its peers by (fake) DNS instead of a fixed list."""
        self.stack = stack
        self.addresses = [free_address() for _ in range(count)]
        self._env = dict(env or {})
        self._peers = dict(peers or {})
        self.dns = dns
        self.hosts: dict[int, ServiceHost] = {}
        self._channels: list[grpc.aio.Channel] = []

    def env_of(self, index: int) -> dict[str, str]:
        listed = self._peers.get(index, range(len(self.addresses)))
        return {
            **self.stack.env,
            "AGENTMESH_GATEWAY_PEERS": self.dns.NAME if self.dns else ",".join(self.addresses[i] for i in listed),
            "AGENTMESH_GATEWAY_ADVERTISE_ADDR": self.addresses[index],
            "AGENTMESH_GATEWAY_PEER_CONNECT_TIMEOUT_S": "1",
            "AGENTMESH_GATEWAY_PEER_REFRESH_S": "0.1",
            # No HTTP listener: its ephemeral port could take a gRPC address reserved above for
            # a replica not started yet (seen as "port is taken"); routing tests speak gRPC.
            "AGENTMESH_GATEWAY_HTTP_ADDR": "off",
            **self._env,
        }

    async def start(self) -> "Replicas":
        """Every replica lists every address, so the addresses are chosen before any starts.
        Another run on the machine may take one of them meanwhile (rare): then the replicas
        started so far stop, that address is chosen again, and all start afresh."""
        for attempt in range(5):
            try:
                for index, address in enumerate(self.addresses):
                    self.hosts[index] = await self._start_replica(index, address)
                return self
            except PortInUse:
                if attempt == 4:
                    raise
                taken = len(self.hosts)
                for index in list(self.hosts):
                    await self.stop_replica(index)
                self.addresses[taken] = free_address()
        return self

    async def _start_replica(self, index: int, address: str) -> ServiceHost:
        settings = dataclasses.replace(Settings.from_env(self.env_of(index)), addresses=dict(self.stack.addresses))
        resolver = self.dns.resolver_for(index) if self.dns else resolve_addresses
        host = await gateway_server.build(settings, setup_telemetry("gateway", settings), address,
                                          peer_resolver=resolver)
        return await host.start()

    async def stop_replica(self, index: int, grace: float = 1) -> None:
        host = self.hosts.pop(index)
        await host.stop(grace=grace)
        host.telemetry.shutdown()

    async def stop(self) -> None:
        for channel in self._channels:
            await channel.close()
        for index in list(self.hosts):
            await self.stop_replica(index)

    async def __aenter__(self) -> "Replicas":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    def stub(self, index: int) -> gateway_pb2_grpc.GatewayStub:
        channel = open_channel(self.addresses[index])
        self._channels.append(channel)
        return gateway_pb2_grpc.GatewayStub(channel)

    def owner(self, session_id: str) -> int:
        return self.addresses.index(owner_of(session_id, self.addresses))

    def session_owned_by(self, index: int, prefix: str = "s") -> str:
        """A session id whose owner, by everyone's full peer list, is replica `index`."""
        return next(f"{prefix}-{n}" for n in range(1000) if self.owner(f"{prefix}-{n}") == index)


