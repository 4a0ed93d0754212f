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

import asyncio

from agentmesh import error_reasons
from agentmesh.clients.memory import MemoryClient
from agentmesh.errors import NotFound, ResourceExhausted
from agentmesh.rpc.audit import AuditLog
from agentmesh.rpc.auth import current_principal, scope_of_call
from agentmesh.rpc.peers import peer_call
from agentmesh.tenancy import AuthPolicy, required_role
from agentmesh.tools.quota import MIB, mib, workspace_usage
from agentmesh.tools.workspace import Workspaces
from agentmesh.v1 import sessions_pb2

__all__ = ["SessionTenants"]

LOOKUP_TIMEOUT_S = 10.0


class SessionTenants:
    def __init__(self, memory: MemoryClient, policy: AuthPolicy, workspaces: Workspaces,
                 audit: AuditLog | None = None):
        self._policy = policy
        self._workspaces = workspaces
        self._memory = memory.stub
        self._target = memory.peer
        self._audit = audit

    async def require(self, session_id: str, method: str) -> str:
        """The session's tenant, if the call's principal may `method` in it; else NOT_FOUND."""
        scope = scope_of_call()
        if scope.unrestricted:
            return ""
        missing = f"session {session_id!r} does not exist"
        try:
            session = await peer_call(self._target, self._memory.GetSession(
                sessions_pb2.GetSessionRequest(session_id=session_id), timeout=LOOKUP_TIMEOUT_S))
        except NotFound:
            raise NotFound(missing) from None
        try:
            return scope.require(session.namespace or "default", required_role(method), missing)
        except NotFound:
            if self._audit is not None:
                self._audit.record("cross_tenant", "refused", current_principal.get(), method=f"tools.{method}",
                                   session_id=session_id)
            raise

    async def check_disk(self, session_id: str, tenant: str) -> None:
        """The tenant's `limits.workspace_mb`: a workspace at or over it takes no more commands or
        uploads (RESOURCE_EXHAUSTED naming the limit) until files are deleted. A check before the
        call, on top of the hard per-session quota (AGENTMESH_TOOLS_WORKSPACE_QUOTA_MB) that stops
        a write in the middle."""
        tenant_entry = self._policy.tenants.get(tenant)
        limit = tenant_entry.limits.workspace_mb if tenant_entry else 0
        if not limit:
            return
        used = await asyncio.to_thread(workspace_usage, self._workspaces.path(session_id))
        if used >= limit * MIB:
            raise ResourceExhausted(
                f"session {session_id!r}'s workspace holds {mib(used)}; tenant {tenant!r} allows {limit} MiB per "
                "workspace (limits.workspace_mb): delete files before running more",
                reason=error_reasons.QUOTA_EXCEEDED, metadata={"limit": "workspace_mb", "tenant": tenant},
            )
