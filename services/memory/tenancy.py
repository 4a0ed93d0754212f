"""Memory keeps tenants apart whoever calls it: the gateway, the agent, or a user directly.

The principal of the call (and so its tenants) comes signed in the internal service token, so
even a service with a valid token cannot read a session or a namespace of a tenant the
principal is not in: a session of another tenant is NOT_FOUND (its id does not leak), a
namespace of another tenant PERMISSION_DENIED with the same sentence as one of nobody's. Each
method needs the role agentmesh.tenancy.REQUIRED_ROLES gives it — the table the gateway checks
too — in the tenant owning the session or namespace: memory is reached directly as well (users
may call some methods; any service signs calls for the principal it serves), so it never relies
on the gateway having asked for admin.
"""

from __future__ import annotations

from agentmesh.errors import NotFound
from agentmesh.ids import validate_id, validate_namespace
from agentmesh.memory.transcript_records import SessionRecord
from agentmesh.memory.transcripts import Transcripts
from agentmesh.rpc.audit import AuditLog
from agentmesh.rpc.auth import current_principal, scope_of_call
from agentmesh.tenancy import required_role

__all__ = ["TenantGuard"]


class TenantGuard:
    def __init__(self, transcripts: Transcripts, audit: AuditLog | None):
        self._transcripts = transcripts
        self._audit = audit

    def _cross_tenant(self, method: str, **what: str) -> None:
        if self._audit is not None:
            self._audit.record("cross_tenant", "refused", current_principal.get(), method=f"memory.{method}", **what)

    async def session(self, session_id: str, method: str) -> SessionRecord:
        """The session, if the principal holds `method`'s role (REQUIRED_ROLES) in its namespace;
        else NOT_FOUND (another tenant's) or PERMISSION_DENIED (a lesser role in one's own)."""
        session = await self._transcripts.get_session(session_id)
        scope = scope_of_call()
        try:
            scope.require(session.namespace, required_role(method), f"session {session_id!r} does not exist")
        except NotFound:
            self._cross_tenant(method, session_id=session_id)
            raise
        return session

    async def session_if_any(self, session_id: str, method: str) -> None:
        """As `session`, but a session that does not exist is left to the method to answer."""
        if scope_of_call().unrestricted:
            return
        try:
            await self.session(validate_id(session_id), method)
        except NotFound:
            # Either it is not there (the method says so) or it is another tenant's: both read
            # as "does not exist", and nothing of the other tenant's is touched.
            if await self._exists(session_id):
                raise
            return

    async def _exists(self, session_id: str) -> bool:
        try:
            await self._transcripts.get_session(session_id)
        except NotFound:
            return False
        return True

    async def may_put(self, session_id: str, namespace: str) -> None:
        """A session may be created in a namespace of one's own tenants; an id another tenant
        already uses reads as not existing (PutSession returns an existing session otherwise)."""
        scope = scope_of_call()
        if scope.unrestricted:
            return
        if await self._exists(validate_id(session_id)):
            await self.session(session_id, "PutSession")
        self.namespace(namespace, "PutSession")

    def namespace(self, namespace: str, method: str, role: str = "") -> None:
        """The principal holds `method`'s role (or `role`, where the handler needs more for what
        this call asks) in the tenant owning `namespace`."""
        scope = scope_of_call()
        if scope.unrestricted:
            return
        namespace = validate_namespace(namespace)
        role = role or required_role(method)
        try:
            scope.require_namespace(namespace, role)
        except Exception:
            if not scope.can(namespace, "viewer"):
                self._cross_tenant(method, namespace=namespace)
            raise

    def audit(self, action: str, **what: str) -> None:
        """One audit line of what the call's principal did (ids and names only)."""
        if self._audit is not None:
            self._audit.record(action, "allowed", current_principal.get(), **what)

    def visible_namespaces(self) -> frozenset[str] | None:
        return scope_of_call().namespaces("viewer")
