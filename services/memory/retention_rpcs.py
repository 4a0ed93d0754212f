# ruff: noqa: N802 - gRPC method names, as in services/*/server.py
"""The memory service's retention and erasure RPCs (retention.py) as a part of MemoryServicer
(server.py) of their own, and who made a record: the principal a session or memory is created
for, kept on it so that erasing a person can find what is theirs."""

from __future__ import annotations

from agentmesh.memory.retention import Retention
from agentmesh.memory.tenancy import TenantGuard
from agentmesh.rpc.auth import current_principal
from agentmesh.rpc.errors import translate_errors
from agentmesh.v1 import memory_pb2, sessions_pb2

__all__ = ["RetentionRpcs", "creator"]


def creator() -> str:
    """The subject of the person the current call runs for ("user:alice"); "" for a service
    acting on its own (a scheduled run's principal is its job's creator, so it counts)."""
    principal = current_principal.get()
    if principal is None or principal.subject.startswith("service:"):
        return ""
    return principal.subject


class RetentionRpcs:
    """Mixed into MemoryServicer, which sets these."""

    _tenants: TenantGuard
    _retention: Retention

    @translate_errors
    async def Sweep(self, request, context):
        if not request.namespace:
            # Listing the namespaces is the sweep's own bookkeeping; each pass is checked below.
            self._tenants.namespace("default", "Sweep")
            return memory_pb2.SweepResponse(namespaces=await self._retention.kept_namespaces())
        self._tenants.namespace(request.namespace, "Sweep")
        done = await self._retention.sweep(request.namespace, request.now, request.max_items,
                                           list(request.workspaces_removed), request.only_note)
        return memory_pb2.SweepResponse(memories_removed=done.memories_removed, usage_removed=done.usage_removed,
                                        expired_sessions=done.expired_sessions,
                                        expired_workspaces=done.expired_workspaces, done=done.done)

    @translate_errors
    async def EraseUser(self, request, context):
        self._tenants.namespace(request.namespace or "default", "EraseUser")
        done = await self._retention.erase_user(request.namespace, request.user, request.max_items)
        return sessions_pb2.EraseUserResponse(memories_removed=done.memories_removed, usage_removed=done.usage_removed,
                                              sessions=done.sessions, done=done.done)
