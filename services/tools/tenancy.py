"""The tools service keeps tenants apart too: a session's workspace only for its own tenant.

Where tenants are configured, every call naming a session asks the memory service for that
session, signed for the call's principal — memory answers NOT_FOUND for another tenant's (or no)
session — and checks the role the call needs (REQUIRED_ROLES) in the session's tenant. So a
user calling `Execute` directly, or a service with a valid token made for tenant A, cannot run
a command in, read or write tenant B's workspace. Nothing is cached: a session id deleted and
made again by another tenant must not keep its old tenant here. Without a policy file nothing is
asked (one tenant owns everything).
"""

from __future__ import annotations

from typing import Any

from agentmesh.errors import NotFound
from agentmesh.rpc.audit import AuditLog
from agentmesh.rpc.auth import current_principal, scope_of_call
from agentmesh.rpc.peers import peer_call
from agentmesh.tenancy import required_role
from agentmesh.v1 import memory_pb2_grpc, sessions_pb2

__all__ = ["SessionTenants"]

LOOKUP_TIMEOUT_S = 10.0


class SessionTenants:
    def __init__(self, channel: Any, target: str, audit: AuditLog | None = None):
        self._memory = memory_pb2_grpc.MemoryStub(channel)  # type: ignore[no-untyped-call]  # generated stubs are untyped
        self._target = f"the memory service at {target}"
        self._audit = audit

    async def require(self, session_id: str, method: str) -> None:
        """Return if the call's principal may `method` in the session `session_id`; else NOT_FOUND."""
        scope = scope_of_call()
        if scope.unrestricted:
            return
        missing = f"session {session_id!r} does not exist"
        try:
            session = await peer_call(self._target, self._memory.GetSession(
                sessions_pb2.GetSessionRequest(session_id=session_id), timeout=LOOKUP_TIMEOUT_S))
        except NotFound:
            raise NotFound(missing) from None
        try:
            scope.require(session.namespace or "default", required_role("Tools", method) or "member", missing)
        except NotFound:
            if self._audit is not None:
                self._audit.record("cross_tenant", "refused", current_principal.get(), method=f"tools.{method}",
                                   session_id=session_id)
            raise
