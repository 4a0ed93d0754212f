"""Who may call what: every service's server checks its callers; every client names itself.

Two kinds of caller reach a service:

- another agentmesh service, with a token it signed for this one call
  (`x-agentmesh-service-token`, see identity.py). Only the services in `CALLERS` may call a
  method; a token from any other service is refused with PERMISSION_DENIED.
- a user (the CLI, an SDK, the web console) with `authorization: Bearer <token>` — a static
  token, a service account's or an OIDC JWT (users.py) — on the methods marked `USERS`, if
  they hold the method's role (agentmesh.tenancy.REQUIRED_ROLES) in some tenant. With no
  credential configured (the local default) user calls are let in, as the gateway always did.

Methods that only services call refuse users whatever they present. Health checks and
reflection stay open so that probes and tooling work. The principal a call was made for
(`sub`/`tenant` of the token, or the user) is set for the handler's context, and the client
interceptor signs it into every call the handler makes in turn, so it travels hop by hop.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import Any, Mapping

import grpc
import structlog
from opentelemetry import trace

from agentmesh.logs import get_logger
from agentmesh.rpc.audit import AuditLog
from agentmesh.rpc.identity import IdentityError, Principal, ServiceIdentity
from agentmesh.rpc.users import Refusal, UserAuthenticator
from agentmesh.tenancy import REQUIRED_ROLES, AuthPolicy, Scope, role_at_least

__all__ = [
    "CALLERS",
    "OPEN_PREFIXES",
    "SERVICE_TOKEN_HEADER",
    "USERS",
    "Allowed",
    "CallerCheck",
    "allowed_callers",
    "bearer_metadata",
    "current_principal",
    "current_scope",
    "scope_of_call",
]

log = get_logger("agentmesh.rpc.auth")

SERVICE_TOKEN_HEADER = "x-agentmesh-service-token"
OPEN_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")
USERS = "users"


@dataclass(frozen=True)
class Allowed:
    services: frozenset[str]
    users: bool = False

    def describe(self) -> str:
        names = sorted(self.services)
        if not names:
            return "users with a token" if self.users else "no one"
        who = " and ".join(f"the {n} service" for n in names)
        return who + (" (and users with a token)" if self.users else "")


def _allow(*callers: str) -> Allowed:
    return Allowed(frozenset(c for c in callers if c != USERS), USERS in callers)


# The call graph, per service and method ("*": every method of the service). Read it with
# docs/security.md's table, which mirrors it.
CALLERS: Mapping[str, Mapping[str, Allowed]] = {
    # Users, the scheduler's runs, other gateway replicas forwarding a session's calls; and the
    # agent, which starts a lead's teammates as runs and reads how they ended (docs/teams.md).
    "gateway": {"*": _allow(USERS, "scheduler", "gateway"),
                "CreateRun": _allow(USERS, "scheduler", "gateway", "agent"),
                "GetRun": _allow(USERS, "scheduler", "gateway", "agent")},
    # Users create and trigger jobs (`agentmesh cron`); the agent asks for its wake-ups.
    "scheduler": {"*": _allow(USERS),
                  # The agent's schedule_wakeup tool, for the user whose turn runs it.
                  "ScheduleWakeup": _allow("agent")},
    # Turns run only for the gateway.
    "agent": {
        "RunTurn": _allow("gateway"),
        # `agentmesh reflect` and the scheduler's idle reflections, through the gateway.
        "Reflect": _allow("gateway"),
    },
    "tools": {
        # `agentmesh tools list|run` is a user's direct call; the agent runs the model's calls;
        # the gateway serves the catalog on its public API (GET /v1/tools).
        "ListTools": _allow("agent", "gateway", USERS),
        # `agentmesh sandbox templates`, a user's direct call as `tools list` is; the gateway may serve them too.
        "ListSandboxTemplates": _allow("gateway", USERS),
        # The agent keeps each namespace's catalog while its version holds (no listing per turn).
        "WatchCatalog": _allow("agent"),
        # ...and knows which sessions have background commands to collect (no call per turn).
        "WatchBackground": _allow("agent"),
        "Execute": _allow("agent", USERS),
        # The agent's Execute calls carried on a stream, each checked as an Execute.
        "CarriedCalls": _allow("agent"),
        # The gateway deletes a session's workspace with the session.
        "DeleteWorkspace": _allow("gateway"),
        # Gateway.ForkSession copies the source's workspace into the fork's.
        "CopyWorkspace": _allow("gateway"),
        # The workspace as people see it: the gateway's workspace routes (the web console),
        # after it checked the caller and that the session exists.
        "ListWorkspace": _allow("gateway"),
        # The agent too: it reads an image a user attached by path, stores a message's images
        # under the workspace's .attachments/ and reads them back into model requests
        # (docs/agent.md "Images") — no more than its Execute calls of read_file and write_file
        # already reach; the tools service lets it write nothing else.
        "ReadWorkspaceFile": _allow("gateway", "agent"),
        "WriteWorkspaceFile": _allow("gateway", "agent"),
        # The agent collects a session's ended background commands before each step, and stops
        # them when a turn is cancelled.
        "BackgroundResults": _allow("agent"),
        "StopBackground": _allow("agent"),
        # A namespace's own MCP servers: the gateway's AddMcpServer, ListMcpServers and
        # RemoveMcpServer (`agentmesh mcp`), after it checked the caller.
        "AddMcpServer": _allow("gateway"),
        "ListMcpServers": _allow("gateway"),
        "RemoveMcpServer": _allow("gateway"),
    },
    "memory": {
        # Sessions and transcripts: the gateway reads and deletes, the agent writes.
        "PutSession": _allow("gateway", "agent"),
        # The tools service asks for a session's tenant before touching its workspace, and reads
        # its A2A depth label before calling a remote A2A agent.
        "GetSession": _allow("gateway", "agent", "tools"),
        "ListSessions": _allow("gateway", "agent"),
        "DeleteSession": _allow("gateway", "agent"),
        "UpdateSession": _allow("gateway"),
        "ListMessages": _allow("gateway", "agent"),
        "AppendMessages": _allow("agent"),
        "AppendStream": _allow("agent"),  # AppendMessages calls carried on a stream, each checked too
        # AppendMessages and StartTurn calls carried on a stream, each checked as its own method.
        "CarriedCalls": _allow("agent"),
        # A turn's first read, append and recall in one call.
        "StartTurn": _allow("agent"),
        # A turn rolled back by a newer message (ChatOptions.if_busy "rollback").
        "DropRun": _allow("gateway"),
        # Gateway.ClearTranscript (the REPL's /clear).
        "ClearTranscript": _allow("gateway"),
        # Gateway.ForkSession: a new session holding the start of another's transcript.
        "ForkSession": _allow("gateway"),
        # A namespace's tool policy: the gateway reads it for every turn and sets it for users
        # (Gateway.UpdateNamespaceSettings, after checking the names against the catalog).
        "GetNamespaceSettings": _allow("gateway"),
        "UpdateNamespaceSettings": _allow("gateway"),
        # Long-term memory: the agent's memory tools, and `agentmesh memory` for users.
        "Remember": _allow("agent", USERS),
        "Search": _allow("agent", "gateway", USERS),  # the gateway: POST /v1/memory/search
        # The gateway too: its ListMemories, GetMemory and ForgetMemory (the console's memory view).
        "GetMemory": _allow("agent", "gateway", USERS),
        "ListMemories": _allow("agent", "gateway", USERS),
        "Forget": _allow("agent", "gateway", USERS),
        "Import": _allow("agent", USERS),
        # Standing instructions: every turn reads them; users set them, directly or through the
        # gateway's GetProfile/SetProfile (`agentmesh profile`).
        "GetProfile": _allow("agent", "gateway", USERS),
        "SetProfile": _allow("gateway", USERS),
        # Skills: every turn lists them and `read_skill` loads one; users manage them
        # (`agentmesh skills`), through the gateway's RPCs of the same names or directly.
        "ListSkills": _allow("agent", "gateway", USERS),
        "GetSkill": _allow("agent", "gateway", USERS),
        # The agent stores reflection's skill proposals, always as drafts (server.py forces it).
        "PutSkill": _allow("agent", "gateway", USERS),
        "ApproveSkill": _allow("gateway", USERS),
        "RemoveSkill": _allow("gateway", USERS),
        "RejectSkill": _allow("gateway", USERS),
        "SetSkillPolicy": _allow("gateway", USERS),
        # Named agents (docs/agents.md): users define them through the gateway's RPCs of the same
        # names; the agent reads one when delegating to it by name (StartTurn resolves a turn's).
        "CreateAgent": _allow("gateway", USERS),
        "UpdateAgent": _allow("gateway", USERS),
        "RollbackAgent": _allow("gateway", USERS),
        "DeleteAgent": _allow("gateway", USERS),
        "GetAgent": _allow("agent", "gateway", USERS),
        "ListAgents": _allow("agent", "gateway", USERS),
        "ListAgentVersions": _allow("gateway", USERS),
        # Promoted tools: the agent stores what `promote_skill` made and lists them each turn;
        # users list and remove them (`agentmesh skills list --tools`).
        "PutPromotedTool": _allow("agent"),
        "ListPromotedTools": _allow("agent", "gateway", USERS),
        "RemovePromotedTool": _allow("gateway", USERS),
        # Reflection: the agent reads and records each session's cursor and runs; users read
        # the history (`agentmesh reflect history`).
        # A namespace's own MCP servers: the tools service registers them (after checking them)
        # and every tools replica reads them when the namespace's version moved.
        "ListMcpRegistrations": _allow("tools"),
        "PutMcpRegistration": _allow("tools"),
        "RemoveMcpRegistration": _allow("tools"),
        # A2A tasks: each gateway replica's a2a-sdk task store writes through and reads back.
        "PutA2aTask": _allow("gateway"),
        "GetA2aTask": _allow("gateway"),
        "GetReflectionState": _allow("agent"),
        "RecordReflection": _allow("agent"),
        "ListReflections": _allow("agent", "gateway", USERS),
        # Usage: the agent records every model call; the gateway sums them (Gateway.GetUsage).
        "RecordUsage": _allow("agent"),
        "RecordModelCalls": _allow("agent"),
        "ListModelCalls": _allow("gateway"),
        "SumUsage": _allow("gateway"),
        # Recall over conversations: the agent's conversation_search; users through the gateway
        # (`agentmesh sessions search`) or directly.
        "SearchConversations": _allow("agent", "gateway", USERS),
        # Memory blocks: the agent edits them (block_append / block_replace); users read them,
        # write, revert them and decide drafts (`agentmesh memory blocks`), through the gateway or
        # directly.
        "EditBlock": _allow("agent"),
        "ListBlocks": _allow("agent", "gateway", USERS),
        "GetBlock": _allow("agent", "gateway", USERS),
        "SetBlock": _allow("gateway", USERS),
        "RevertBlock": _allow("gateway", USERS),
        "ApproveBlockEdit": _allow("gateway", USERS),
        "RejectBlockEdit": _allow("gateway", USERS),
        "SetBlockPolicy": _allow("gateway", USERS),
        # Runs: each gateway replica records the turns it runs and reads any replica's back.
        "PutRunRecord": _allow("gateway"),
        "PutRunRecords": _allow("gateway"),
        # Teams: the agents running a lead and its teammates; the gateway shows a team.
        "SwapTeamRecord": _allow("agent", "gateway"),
        "ListTeamRecords": _allow("agent", "gateway"),
        "WaitTeam": _allow("agent"),
        "GetRunRecord": _allow("gateway"),
        "ListRunRecords": _allow("gateway"),
        "GetWebhookSecret": _allow("gateway"),
        "GetNamespaceWebhook": _allow("gateway"),
        "SetNamespaceWebhook": _allow("gateway"),
        # Retention and erasure: the gateway's SweepRetention and EraseUser drive the passes and
        # remove the sessions (and workspaces) they name.
        "Sweep": _allow("gateway"),
        "EraseUser": _allow("gateway"),
        # `agentmesh import` writes exported sessions with their transcripts.
        "RestoreSession": _allow("gateway", USERS),
        "RestoreBlock": _allow("gateway", USERS),
        "RestorePromotedTool": _allow("gateway", USERS),
    },
}

_NOBODY = Allowed(frozenset())

# The principal the current RPC runs for; the client interceptor signs it into onward calls.
current_principal: contextvars.ContextVar[Principal | None] = contextvars.ContextVar("principal", default=None)
# What that principal may see: its tenants' namespaces at their roles (unrestricted without a
# policy file). Handlers pass it to their cores, which check what each call touches.
current_scope: contextvars.ContextVar[Scope | None] = contextvars.ContextVar("scope", default=None)


def scope_of_call() -> Scope:
    """The current call's scope; outside any call (tests driving a core) nothing is restricted."""
    return current_scope.get() or AuthPolicy().scope(None)


def allowed_callers(service: str, method: str) -> Allowed:
    rules = CALLERS.get(service, {})
    return rules.get(method) or rules.get("*") or _NOBODY


def _metadata_value(metadata: Any, name: str) -> str | None:
    for key, value in metadata or ():
        if key == name:
            return value if isinstance(value, str) else str(value.decode())
    return None


def _bearer(metadata: Any) -> str | None:
    value = _metadata_value(metadata, "authorization")
    if value is None:
        return None
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


class CallerCheck:
    """Admits a call only from the callers `CALLERS` lists for the method it names; a user's own
    call also needs the role `REQUIRED_ROLES` (agentmesh.tenancy) names for it in some tenant.
    Run by the server's call interceptor (calls.py) before the method's handler is chosen, so a
    refused call is answered without its request being read."""

    def __init__(self, service: str, identity: ServiceIdentity, users: UserAuthenticator,
                 audit: AuditLog | None = None):
        self._service = service
        self._identity = identity
        self._users = users
        self._audit = audit

    @property
    def policy(self) -> AuthPolicy:
        return self._users.policy

    async def admit(self, full_method: str, metadata: Any) -> Principal | tuple[grpc.StatusCode, str]:
        """The principal the call runs for, or the status and message that refuse it."""
        grpc_service, _, method = full_method.lstrip("/").partition("/")
        decision = await self._decide(grpc_service.rsplit(".", 1)[-1], method, metadata)
        if not isinstance(decision, Principal):
            # A refused call is worth a line: it is a misconfiguration or someone probing.
            log.warning("call refused", method=f"{self._service}.{method}", code=decision[0].name, reason=decision[1])
        return decision

    async def _decide(self, grpc_service: str, method: str, metadata: Any) -> Principal | tuple[grpc.StatusCode, str]:
        allowed = allowed_callers(self._service, method)
        what = f"{self._service}.{method}"

        token = _metadata_value(metadata, SERVICE_TOKEN_HEADER)
        if token is not None:
            try:
                principal = self._identity.verify(token)
            except IdentityError as exc:
                return grpc.StatusCode.UNAUTHENTICATED, f"{what} refused: {exc}"
            if principal.via not in allowed.services:
                return (grpc.StatusCode.PERMISSION_DENIED,
                        f"{what} refused: the {principal.via} service may not call it; only {allowed.describe()} may")
            return principal

        bearer = _bearer(metadata)
        user = await self._users.authenticate(bearer)
        if allowed.users:
            if isinstance(user, Refusal):
                self._refused_sign_in(what, user)
                code = grpc.StatusCode.PERMISSION_DENIED if user.authenticated else grpc.StatusCode.UNAUTHENTICATED
                return code, f"{what} refused: {user.reason}"
            return self._with_role(grpc_service, method, what, user)
        if self._users.enabled and isinstance(user, Principal):
            return (grpc.StatusCode.PERMISSION_DENIED,
                    f"{what} is internal: a user's token is not enough, only {allowed.describe()} may call it")
        return (grpc.StatusCode.UNAUTHENTICATED,
                f"{what} is internal: only {allowed.describe()} may call it, with a signed service token "
                "(users reach it through the gateway)")

    def _with_role(self, grpc_service: str, method: str, what: str,
                   user: Principal) -> Principal | tuple[grpc.StatusCode, str]:
        """A user's own call: the coarse check — the method's role in at least one tenant. What
        the call touches is checked against its tenant by the handler (`current_scope`)."""
        scope = self.policy.scope(user.tenant)
        if scope.unrestricted:
            return user
        needed = REQUIRED_ROLES.get(method)
        if needed is None:
            return (grpc.StatusCode.PERMISSION_DENIED,
                    f"{what} refused: no role is declared for it (agentmesh.tenancy.REQUIRED_ROLES), so users may not call it")
        if not role_at_least(scope.best_role(), needed):
            if self._audit is not None:
                self._audit.record("call.refused", "refused", user, method=what, needed=needed)
            tenants = ", ".join(f"{t} ({r})" for t, r in sorted((scope.memberships or {}).items())) or "none"
            return (grpc.StatusCode.PERMISSION_DENIED,
                    f"{what} needs the {needed} role in a tenant; your tenants: {tenants}")
        return user

    def _refused_sign_in(self, what: str, refusal_: Refusal) -> None:
        if self._audit is not None:
            self._audit.record("login.refused", "refused", None, method=what, reason=refusal_.reason,
                               credential=refusal_.credential)

    def enter(self, principal: Principal, span: trace.Span) -> None:
        """Run the handler as `principal`: set for it and what it starts (each RPC runs in its
        own task, so the values stay with this call), on the call's span and log lines."""
        current_principal.set(principal)
        current_scope.set(self.policy.scope(principal.tenant))
        # Who the work is for, on the call's span and on each log line it writes.
        span.set_attribute("enduser.id", principal.subject)
        if principal.tenant:
            # Its tenants and roles (`acme=member`), so a trace shows whose data a call touched.
            span.set_attribute("agentmesh.tenants", principal.tenant)
        structlog.contextvars.bind_contextvars(principal=principal.subject)


def bearer_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """What a user's client sends: `authorization: Bearer <token>` (nothing without a token)."""
    return (("authorization", f"Bearer {token}"),) if token else ()
