"""The registrations port (registry.py) on the memory service."""

from __future__ import annotations

from agentmesh.clients.memory import MemoryClient
from agentmesh.internal.v1 import memory_service_pb2
from agentmesh.rpc.peers import peer_call
from agentmesh.tools.mcp.registry import Registration

__all__ = ["MemoryRegistrations"]

RPC_TIMEOUT_S = 10.0


def _to_proto(s: Registration) -> memory_service_pb2.McpRegistration:
    return memory_service_pb2.McpRegistration(name=s.name, command=s.command, args=list(s.args), url=s.url,
                                      headers=dict(s.headers), env_secrets=dict(s.env_secrets),
                                      header_secrets=dict(s.header_secrets), added_at=s.added_at)


def _from_proto(m: memory_service_pb2.McpRegistration) -> Registration:
    return Registration(name=m.name, command=m.command, args=tuple(m.args), url=m.url, headers=dict(m.headers),
                        env_secrets=dict(m.env_secrets), header_secrets=dict(m.header_secrets), added_at=m.added_at)


class MemoryRegistrations:
    """The registrations on the memory service (its ListMcpRegistrations, PutMcpRegistration and
    RemoveMcpRegistration), signed for the principal of the call being served."""

    def __init__(self, memory: MemoryClient):
        self._stub = memory.stub
        self._peer = memory.peer

    async def list(self, namespace: str) -> tuple[list[Registration], float]:
        reply = await peer_call(self._peer, self._stub.ListMcpRegistrations(
            memory_service_pb2.ListMcpRegistrationsRequest(namespace=namespace), timeout=RPC_TIMEOUT_S))
        return [_from_proto(s) for s in reply.servers], reply.version

    async def put(self, namespace: str, server: Registration, *, only_if_absent: bool) -> float:
        reply = await peer_call(self._peer, self._stub.PutMcpRegistration(memory_service_pb2.PutMcpRegistrationRequest(
            namespace=namespace, server=_to_proto(server), only_if_absent=only_if_absent), timeout=RPC_TIMEOUT_S))
        return float(reply.version)

    async def remove(self, namespace: str, name: str) -> float:
        reply = await peer_call(self._peer, self._stub.RemoveMcpRegistration(
            memory_service_pb2.RemoveMcpRegistrationRequest(namespace=namespace, name=name), timeout=RPC_TIMEOUT_S))
        return float(reply.version)
