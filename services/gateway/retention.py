"""Retention sweeps and erasure, driven from the gateway (docs/memory.md#retention).

Memory decides what expired (or is a person's) and removes memories and usage records itself;
a session also has a workspace in the tools service, which memory does not call. The gateway
calls both already (DeleteSession), so it drives the passes: for each session a pass names it
removes the workspace first, then the session — a pass cut short leaves the session in place,
and the next pass names it again. A session with a turn running here is left for a later pass.

The scheduler's leader calls SweepRetention every AGENTMESH_RETENTION_SWEEP_S: the scheduler
already elects exactly one leader (a file lock or a Kubernetes Lease) and calls the gateway for
its runs, so the sweep needs no second election; several gateway or memory replicas stay
stateless, and a sweep that two leaders ran at once (a lease changing hands) removes each
record once, since removing is idempotent.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Iterator, Protocol

from agentmesh.errors import InvalidArgument
from agentmesh.internal.v1 import memory_service_pb2
from agentmesh.logs import get_logger
from agentmesh.rpc.auth import current_principal
from agentmesh.rpc.identity import Principal
from agentmesh.telemetry.instruments import ServiceMetrics
from agentmesh.tenancy import encode_memberships
from agentmesh.v1 import gateway_pb2, sessions_pb2

__all__ = ["RetentionDriver"]

log = get_logger("agentmesh.gateway.retention")
MAX_PASSES = 100_000


class RetentionMemory(Protocol):
    async def sweep(self, request: memory_service_pb2.SweepRequest) -> memory_service_pb2.SweepResponse: ...
    async def erase_user(self, request: sessions_pb2.EraseUserRequest) -> sessions_pb2.EraseUserResponse: ...
    async def delete_session(self, session_id: str) -> bool: ...


class Workspaces(Protocol):
    async def delete_workspace(self, session_id: str) -> None: ...


class Audit(Protocol):
    def record(self, action: str, outcome: str = "allowed", principal: Any = None, **fields: Any) -> None: ...


class RetentionDriver:
    def __init__(self, memory: RetentionMemory, workspaces: Workspaces, busy: Callable[[str], bool],
                 audit: Audit, metrics: ServiceMetrics | None, owner_of: Callable[[str], str | None] | None = None):
        # owner_of: the tenant owning a namespace, under a tenant policy (None: no policy).
        self._owner_of = owner_of
        self._memory = memory
        self._workspaces = workspaces
        self._busy = busy
        self._audit = audit
        self._metrics = metrics

    def _count(self, kind: str, count: int, reason: str) -> None:
        if self._metrics is not None:
            self._metrics.record_retention_removed(kind, count, reason)

    async def _remove_session(self, session_id: str) -> bool:
        if self._busy(session_id):
            return False
        await self._workspaces.delete_workspace(session_id)
        return await self._memory.delete_session(session_id)

    async def sweep(self, request: gateway_pb2.SweepRetentionRequest, principal: Any = None
                    ) -> gateway_pb2.SweepRetentionResponse:
        if request.max_passes < 0 or request.max_passes > MAX_PASSES:
            raise InvalidArgument(f"max_passes must be between 0 (until done) and {MAX_PASSES}, "
                                  f"got {request.max_passes}", field="max_passes")
        if request.namespace:
            namespaces = [request.namespace]
        else:
            namespaces = list((await self._memory.sweep(memory_service_pb2.SweepRequest())).namespaces)
        total = gateway_pb2.SweepRetentionResponse(done=True)
        now = request.now or time.time()  # one instant for every pass of this sweep
        for namespace in namespaces:
            with self._admin_of(namespace, principal, own=not request.namespace):
                done = await self._sweep_namespace(namespace, request.max_items, now, request.max_passes or MAX_PASSES,
                                                   total)
            total.done = total.done and done
        if total.sessions_removed or total.workspaces_removed or total.memories_removed or total.usage_removed:
            self._audit.record("retention.sweep", "allowed", principal, namespaces=",".join(namespaces),
                               sessions=str(total.sessions_removed), workspaces=str(total.workspaces_removed),
                               memories=str(total.memories_removed), usage=str(total.usage_removed))
        return total

    @contextlib.contextmanager
    def _admin_of(self, namespace: str, principal: Any, own: bool) -> Iterator[None]:
        """A sweep of every namespace is the deployment's own (the scheduler's leader): under a
        tenant policy no principal is in every tenant, so each namespace's passes are signed for
        the sweeper as admin of the tenant owning it — memory checks each pass as usual."""
        tenant = self._owner_of(namespace) if (own and self._owner_of is not None) else None
        if tenant is None:
            yield
            return
        subject = principal.subject if principal is not None else "service:gateway"
        token = current_principal.set(Principal(subject=subject, tenant=encode_memberships({tenant: "admin"})))
        try:
            yield
        finally:
            current_principal.reset(token)

    async def _sweep_namespace(self, namespace: str, max_items: int, now: float, passes: int,
                               total: gateway_pb2.SweepRetentionResponse) -> bool:
        acknowledged: list[str] = []
        for _ in range(passes):
            reply = await self._memory.sweep(memory_service_pb2.SweepRequest(
                namespace=namespace, max_items=max_items, now=now, workspaces_removed=acknowledged))
            acknowledged = []
            sessions = 0
            for session_id in reply.expired_sessions:
                sessions += await self._remove_session(session_id)
            for session_id in reply.expired_workspaces:
                await self._workspaces.delete_workspace(session_id)
                acknowledged.append(session_id)
            total.sessions_removed += sessions
            total.workspaces_removed += sessions + len(acknowledged)
            total.memories_removed += reply.memories_removed
            total.usage_removed += reply.usage_removed
            self._count("sessions", sessions, "retention")
            self._count("workspaces", sessions + len(acknowledged), "retention")
            self._count("memories", reply.memories_removed, "retention")
            self._count("usage", reply.usage_removed, "retention")
            if reply.done and not acknowledged:
                return True
        if acknowledged:  # the last pass's workspaces, noted so the next sweep skips them
            await self._memory.sweep(memory_service_pb2.SweepRequest(namespace=namespace, now=now, only_note=True,
                                                             workspaces_removed=acknowledged))
        return False

    async def erase_user(self, namespace: str, user: str, principal: Any = None) -> sessions_pb2.EraseUserResponse:
        total = sessions_pb2.EraseUserResponse(done=False)
        while True:
            reply = await self._memory.erase_user(sessions_pb2.EraseUserRequest(namespace=namespace, user=user))
            total.memories_removed += reply.memories_removed
            total.usage_removed += reply.usage_removed
            removed = [s for s in reply.sessions if await self._remove_session(s)]
            total.sessions.extend(removed)
            self._count("memories", reply.memories_removed, "erasure")
            self._count("usage", reply.usage_removed, "erasure")
            self._count("sessions", len(removed), "erasure")
            self._count("workspaces", len(removed), "erasure")
            left = len(reply.sessions) - len(removed)
            if reply.done and not left:
                total.done = True
                break
            if left and not (reply.memories_removed or reply.usage_removed or removed):
                break  # only sessions with a turn running are left: say so rather than spin
        self._audit.record("user.erase", "allowed" if total.done else "partial", principal, namespace=namespace,
                           user=user, sessions=str(len(total.sessions)), memories=str(total.memories_removed),
                           usage=str(total.usage_removed))
        log.info("user erased", namespace=namespace, user=user, sessions=len(total.sessions),
                 memories=total.memories_removed, usage=total.usage_removed, done=total.done)
        return total
