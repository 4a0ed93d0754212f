"""The gateway's authorisation: who may touch which session, namespace and turn. Plain Python.

One place decides, for every public RPC: the role it needs comes from the table
`agentmesh.tenancy.REQUIRED_ROLES` (the interceptor has already checked that the caller holds
it in some tenant), and here that role is checked against the tenant owning what the call
touches. Another tenant's session is NOT_FOUND with the sentence a missing one gets; a lesser
role in one's own tenant is PERMISSION_DENIED. The memory service checks the tenant again on
its side (the principal travels in the service token), so a gap here is not a leak there.

Adding an RPC: give it a row in REQUIRED_ROLES, and call `session(...)` or `namespace(...)`
here with that role before the core does anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from agentmesh.errors import NotFound, PermissionDenied
from agentmesh.ids import validate_id, validate_namespace
from agentmesh.tenancy import AuthPolicy, Scope, required_role, role_at_least
from agentmesh.v1 import sessions_pb2

__all__ = ["ANYONE", "Auditor", "Authorizer", "Caller", "SessionLookup"]


class SessionLookup(Protocol):
    async def get_session(self, session_id: str) -> sessions_pb2.Session: ...


class Auditor(Protocol):
    def record(self, action: str, outcome: str = "allowed", principal: Any = None, **fields: Any) -> None: ...


@dataclass(frozen=True)
class Caller:
    """Who makes the call, as the core needs it: a name for logs and runs, and what they may see."""

    subject: str = "user:anonymous"
    scope: Scope = field(default_factory=lambda: AuthPolicy().scope(None))
    # The principal itself (agentmesh.rpc.identity.Principal), for the audit log.
    principal: Any = None

    def role(self, rpc: str) -> str:
        return required_role(rpc)


# A call made with no principal in view (a core driven directly, as the unit tests do).
ANYONE = Caller()


class _NoAudit:
    def record(self, action: str, outcome: str = "allowed", principal: Any = None, **fields: Any) -> None:
        return None


class Authorizer:
    def __init__(self, sessions: SessionLookup, audit: Auditor | None = None):
        self._sessions = sessions
        self.audit: Auditor = audit or _NoAudit()

    async def session(self, caller: Caller, session_id: str, rpc: str) -> sessions_pb2.Session:
        """The session `rpc` acts on, if `caller` holds the rpc's role in its tenant."""
        validate_id(session_id)
        session = await self._sessions.get_session(session_id)  # memory: NOT_FOUND for another tenant's
        self.known_session(caller, session_id, session.namespace, rpc)
        return session

    def known_session(self, caller: Caller, session_id: str, namespace: str, rpc: str) -> None:
        """As `session`, for a session whose namespace is already known here (a running turn's)."""
        try:
            caller.scope.require(namespace or "default", caller.role(rpc), f"session {session_id!r} does not exist")
        except NotFound:
            self.audit.record("cross_tenant", "refused", caller.principal, method=f"gateway.{rpc}", session_id=session_id)
            raise
        except PermissionDenied as exc:
            self.audit.record("call.refused", "refused", caller.principal, method=f"gateway.{rpc}",
                              session_id=session_id, reason=exc.message)
            raise

    async def session_or_none(self, caller: Caller, session_id: str, rpc: str) -> sessions_pb2.Session | None:
        """As `session`, but None when no session has that id (Chat creates it; an id another
        tenant uses is refused by memory when the gateway tries to create it)."""
        try:
            return await self.session(caller, session_id, rpc)
        except NotFound:
            return None

    @staticmethod
    def one_tenant(caller: Caller, rpc: str) -> bool:
        """Whether `caller` holds the rpc's role in exactly one tenant: every session they may
        act on is then that tenant's, and memory's own check of a session (the same `require`,
        the same sentences) is the whole check — no read of the session first is needed."""
        memberships = caller.scope.memberships
        if memberships is None:
            return True
        return sum(1 for role in memberships.values() if role_at_least(role, caller.role(rpc))) == 1

    def namespace(self, caller: Caller, namespace: str, rpc: str) -> str:
        """A namespace the caller names (to create a session in, to search): theirs at the rpc's role."""
        namespace = validate_namespace(namespace or caller.scope.default_namespace(caller.role(rpc)))
        try:
            caller.scope.require_namespace(namespace, caller.role(rpc))
        except PermissionDenied:
            outcome = "cross_tenant" if not caller.scope.can(namespace, "viewer") else "call.refused"
            self.audit.record(outcome, "refused", caller.principal, method=f"gateway.{rpc}", namespace=namespace)
            raise
        return namespace
