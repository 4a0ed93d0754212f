"""Tenants, roles and the one table of who may do what: the authorisation core.

Pure Python, shared by every service (a layer below the configuration, above the errors):

- `AuthPolicy` is AGENTMESH_AUTH_POLICY parsed (YAML or JSON): the OIDC issuer, the tenants
  with the namespaces they own and their members, and the service accounts (tokens stored as
  SHA-256 digests). `parse_policy` refuses a bad file with a sentence naming the entry.
- `REQUIRED_ROLES` is the table: for every RPC of every service, by method name, the role it
  needs in the tenant that owns what the call touches. The gateway, memory, the tools service
  and the scheduler all check against it; none keeps a copy. An RPC missing from it is refused
  to users and needs admin in the handlers (fail closed); `tests/security/test_tenancy.py`
  checks that every RPC has a row. Add a row here when you add an RPC.
- `Scope` is the decision for one principal: which namespaces it sees at which role.
  `require` answers NOT_FOUND for what belongs to another tenant (so ids do not leak) and
  PERMISSION_DENIED for a lesser role in the caller's own tenant.

A principal's tenants travel between services as one string, `acme=admin,beta=viewer` (the
`tenant` claim of the internal service token, the scheduler's stored job creator), built and
read by `encode_memberships`/`decode_memberships`.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from agentmesh.errors import NotFound, PermissionDenied

__all__ = [
    "LEGACY_TENANT",
    "REQUIRED_ROLES",
    "ROLES",
    "AuthPolicy",
    "Member",
    "OidcSettings",
    "PolicyError",
    "Scope",
    "ServiceAccount",
    "Tenant",
    "TenantLimits",
    "decode_memberships",
    "encode_memberships",
    "load_policy_file",
    "parse_policy",
    "required_role",
    "role_at_least",
    "token_digest",
]

# Lowest first: each role can do what the ones before it can.
ROLES = ("viewer", "member", "admin")
_RANK = {role: rank for rank, role in enumerate(ROLES)}

# The tenant AGENTMESH_AUTH_TOKENS (and no configuration at all) amounts to: every namespace.
LEGACY_TENANT = "default"
_ALL = "*"

# The role each RPC needs in the tenant owning what it touches, by method name — the one table,
# for every service. A name means one action wherever it is served: the gateway's SetProfile and
# the memory method it forwards to are one row, so no service can be reached with a lesser role
# than another asks for (memory is called directly too: by users, and by any service signing a
# call for a user's principal). Every RPC of every service has a row (tests/security/
# test_tenancy.py); an RPC without one is refused to users, and needs admin in the handlers.
# Public API: viewer reads, member works in a session, admin changes the deployment's set-up.
REQUIRED_ROLES: Mapping[str, str] = {
    # Sessions and transcripts.
    "CreateSession": "member",
    "PutSession": "member",
    "GetSession": "viewer",
    "ListSessions": "viewer",
    "DeleteSession": "admin",     # a session, its transcript and its workspace, for everyone in it
    "DeleteWorkspace": "admin",   # (the gateway deletes a session's workspace with the session)
    "UpdateSession": "member",    # its own model, permission mode and tools
    "GetTranscript": "viewer",
    "ListModelCalls": "viewer",  # a model call's payloads are the transcript's, as the model saw it
    "RecordModelCalls": "member",  # the agent, for each model call when recording is on
    "ListMessages": "viewer",
    "ClearTranscript": "member",  # the REPL's /clear: the person chatting in it may
    # Time travel: a new session from another's start and a copy of its workspace, in its
    # namespace — what a member could build by chatting; the source is left as it was.
    "ForkSession": "member",
    "CopyWorkspace": "member",
    # Turns: chatting is a member's; the agent's turn and every memory write it makes are too.
    "Chat": "member",
    "RunTurn": "member",
    "Cancel": "member",
    "Approve": "member",          # a member decides the runs they started; an admin any
    "ListApprovals": "viewer",
    "StartTurn": "member",        # a turn's first read, append and recall, in one call
    "AppendMessages": "member",
    "DropRun": "member",          # a turn rolled back by a newer message of the same session
    # Streams that carry the agent's calls: opened by the agent for itself; each call on them
    # is checked as its own method (AppendMessages, StartTurn, Execute).
    "AppendStream": "member",
    "CarriedCalls": "member",
    # Usage, the activity view and attaching: reading, limited to the caller's namespaces.
    "GetUsage": "viewer",
    "SumUsage": "viewer",
    "RecordUsage": "member",      # the agent, for every model call of a turn
    "WatchActivity": "viewer",
    "AttachTurn": "viewer",
    "GetTrace": "viewer",
    "ListModels": "viewer",
    # Tools and workspaces: `agentmesh tools list|run`, and every tool call of a turn.
    "ListTools": "viewer",
    "WatchCatalog": "viewer",
    "ListSandboxTemplates": "viewer",
    "Execute": "member",
    "ListWorkspace": "viewer",
    "ReadWorkspaceFile": "viewer",
    "WriteWorkspaceFile": "member",
    "BackgroundResults": "member",
    "StopBackground": "member",
    "WatchBackground": "member",
    # Tool policies: reading a namespace's is for anyone in the tenant, changing it is set-up.
    "GetNamespaceSettings": "viewer",
    "UpdateNamespaceSettings": "admin",
    # A namespace's own MCP servers (`agentmesh mcp`): they run programs for everyone in it, so
    # adding and removing one is set-up — at the gateway, the tools service and memory alike.
    "AddMcpServer": "admin",
    "RemoveMcpServer": "admin",
    "PutMcpRegistration": "admin",
    "RemoveMcpRegistration": "admin",
    "ListMcpServers": "viewer",
    "ListMcpRegistrations": "viewer",
    # Long-term memory is read and written by members (users: `agentmesh memory`; the agent's
    # memory tools).
    "SearchMemory": "member",
    "Remember": "member",
    "Search": "member",
    "GetMemory": "member",
    "ListMemories": "member",
    "Forget": "member",
    "ForgetMemory": "member",  # the gateway's Forget of one memory (the console's memory view)
    "Import": "member",
    # What the agent learns in a namespace: reading it is for anyone in the tenant; reflecting,
    # adding a skill (a draft, unless an admin turned on auto-accept) and promoting a tool is a
    # member's work in a session; what changes every turn of the namespace (standing
    # instructions, approving or removing skills and tools, auto-accept) is set-up.
    "Reflect": "member",
    "GetReflectionState": "viewer",
    "RecordReflection": "member",
    "ListReflections": "viewer",
    "GetProfile": "viewer",
    "SetProfile": "admin",
    # Named agents (docs/agents.md): an admin defines them, a viewer reads them; a member runs
    # them (Chat, as GetAgent inside StartTurn). Same names on the gateway and memory.
    "CreateAgent": "admin",
    "UpdateAgent": "admin",
    "RollbackAgent": "admin",
    "DeleteAgent": "admin",
    "GetAgent": "viewer",
    "ListAgents": "viewer",
    "ListAgentVersions": "viewer",
    "PutSkill": "member",
    "ListSkills": "viewer",
    "GetSkill": "viewer",
    "ApproveSkill": "admin",
    "RemoveSkill": "admin",
    "RejectSkill": "admin",
    "SetSkillPolicy": "admin",
    "PutPromotedTool": "member",
    "ListPromotedTools": "viewer",
    "RemovePromotedTool": "admin",
    # Recall over a namespace's conversations: its transcripts, so a member's, like Search.
    "SearchConversations": "member",
    # Memory blocks: every turn of the namespace shows them. The agent edits them in a member's
    # turn (a draft when the namespace says so); reading them is for anyone in the tenant;
    # a person writing one, restoring a version, deciding a draft and the policy are set-up, like
    # SetProfile. Reading another person's `user` block (ListBlocks all_users, GetBlock user) needs
    # admin too, checked in the handler beside this row.
    "ListBlocks": "viewer",
    "GetBlock": "viewer",
    "EditBlock": "member",
    "SetBlock": "admin",
    "RevertBlock": "admin",
    "ApproveBlockEdit": "admin",
    "RejectBlockEdit": "admin",
    "SetBlockPolicy": "admin",
    # A2A tasks: the gateway, for an A2A message's task; tasks/get on any gateway replica.
    "PutA2aTask": "member",
    "GetA2aTask": "viewer",
    # Cron jobs are set-up; their runs and history are there to read.
    "CreateJob": "admin",
    "UpdateJob": "admin",
    "DeleteJob": "admin",
    "ToggleJob": "admin",
    "TriggerJob": "admin",
    "GetJob": "viewer",
    "ListJobs": "viewer",
    "ListRuns": "viewer",         # a cron job's runs (scheduler), a namespace's turns (gateway)
    # Runs: a turn as a resource (docs/api.md, "Runs"). Starting and cancelling one is a member's,
    # as Chat and Cancel are; the records memory keeps for the gateways follow the same rows.
    "CreateRun": "member",
    "GetRun": "viewer",
    "JoinRun": "viewer",
    "CancelRun": "member",
    "PutRunRecord": "member",
    "PutRunRecords": "member",
    # Teams (docs/teams.md): a member's lead turn and its teammates' turns keep them.
    "SwapTeamRecord": "member",
    "ListTeamRecords": "viewer",
    "WaitTeam": "viewer",
    "GetTeam": "viewer",
    "SendTeamMessage": "member",  # as Chat: it reaches an agent's next step
    "StopTeammates": "member",    # as Cancel
    "GetRunRecord": "viewer",
    "ListRunRecords": "viewer",
    # The secret a namespace's run webhooks are signed with: whoever holds it can forge them.
    "GetWebhookSecret": "admin",
    "GetNamespaceWebhook": "viewer",
    "SetNamespaceWebhook": "admin",  # where every run of the namespace reports: set-up
    # The agent's schedule_wakeup: a member's turn resuming its own session later.
    "ScheduleWakeup": "member",
    "CancelWakeup": "member",  # the user whose agent asked for it (any wake-up of their tenant)
    # Retention and erasure destroy records for good (docs/memory.md#retention): set-up only.
    "SweepRetention": "admin",
    "Sweep": "admin",
    "EraseUser": "admin",
    # Import writes sessions as exported (another person's creator and transcript): set-up only.
    "RestoreSession": "admin",
    "RestoreBlock": "admin",
    "RestorePromotedTool": "admin",  # code every turn of the namespace may run: set-up
}


def required_role(method: str) -> str:
    """The role `method` ("SetProfile", as in the proto) needs, whichever service serves it. A
    method without a row needs admin: fail closed (the table's test names the missing row)."""
    return REQUIRED_ROLES.get(method, "admin")


def role_at_least(role: str | None, needed: str) -> bool:
    return role is not None and _RANK.get(role, -1) >= _RANK[needed]


class PolicyError(ValueError):
    """The policy file is malformed; the message names the entry."""


def token_digest(token: str) -> str:
    """How a token is stored: the hex SHA-256 of its UTF-8 bytes (`printf %s TOKEN | sha256sum`)."""
    return hashlib.sha256(token.encode()).hexdigest()


def encode_memberships(memberships: Mapping[str, str]) -> str:
    return ",".join(f"{tenant}={role}" for tenant, role in sorted(memberships.items()))


def decode_memberships(value: str) -> dict[str, str]:
    """`acme=admin,beta=viewer` -> {"acme": "admin", "beta": "viewer"}; entries that are not
    `tenant=role` with a known role are dropped (they grant nothing)."""
    result: dict[str, str] = {}
    for item in value.split(",") if value else ():
        tenant, sep, role = item.strip().partition("=")
        if sep and tenant and role in _RANK:
            result[tenant] = role
    return result


@dataclass(frozen=True)
class Member:
    role: str
    group: str = ""
    subject: str = ""


@dataclass(frozen=True)
class TenantLimits:
    """0: no limit. Enforced by the gateway (turns, tokens) and the tools service (disk)."""

    concurrent_turns: int = 0
    tokens_per_day: int = 0
    workspace_mb: int = 0


@dataclass(frozen=True)
class Tenant:
    name: str
    namespaces: tuple[str, ...]
    members: tuple[Member, ...] = ()
    limits: TenantLimits = TenantLimits()

    @property
    def home_namespace(self) -> str:
        """Where a session goes when the caller names no namespace: the tenant's first one."""
        return "default" if self.namespaces[0] == _ALL else self.namespaces[0]


@dataclass(frozen=True)
class ServiceAccount:
    name: str
    token_sha256: str = field(repr=False)
    tenant: str
    role: str


@dataclass(frozen=True)
class OidcSettings:
    issuer: str
    audience: str
    subject_claim: str = "sub"
    name_claim: str = "name"
    groups_claim: str = "groups"
    # Tokens whose clocks disagree with ours by up to this much are still accepted.
    clock_skew_s: int = 60
    # An unknown `kid` refetches the issuer's keys at most this often (a flood of forged kids
    # must not become a flood of requests to the IdP).
    jwks_refresh_min_s: float = 30.0
    # Keys are refetched at least this often even when every kid is known (rotations retire keys).
    jwks_max_age_s: float = 3600.0
    algorithms: tuple[str, ...] = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")


@dataclass(frozen=True)
class AuthPolicy:
    """Who may sign in and what they may do. `enforced` is False without a policy file: then
    every authenticated caller (any static token; anyone at all when no token is configured)
    is admin of one tenant owning every namespace, as before tenants existed."""

    tenants: Mapping[str, Tenant] = field(default_factory=dict)
    service_accounts: tuple[ServiceAccount, ...] = ()
    oidc: OidcSettings | None = None
    enforced: bool = False
    # Digests of AGENTMESH_AUTH_TOKENS: admin of LEGACY_TENANT (or of every tenant of the file).
    static_token_digests: tuple[str, ...] = field(default=(), repr=False)
    source: str = ""

    @property
    def checks_users(self) -> bool:
        """Whether a user must present a credential (else everyone is let in, the local default)."""
        return bool(self.static_token_digests or self.service_accounts or self.oidc or self.enforced)

    def with_static_tokens(self, tokens: Iterable[str]) -> "AuthPolicy":
        digests = tuple(token_digest(t) for t in tokens if t)
        tenants = self.tenants
        if digests and not self.enforced and not tenants:
            tenants = {LEGACY_TENANT: Tenant(LEGACY_TENANT, (_ALL,))}
        return AuthPolicy(tenants, self.service_accounts, self.oidc, self.enforced, digests, self.source)

    def static_token_memberships(self) -> dict[str, str]:
        return dict.fromkeys(self.tenants, "admin") or {LEGACY_TENANT: "admin"}

    def static_token(self, token: str) -> str | None:
        """The digest of `token` when it is one of AGENTMESH_AUTH_TOKENS (compared in constant time)."""
        digest = token_digest(token)
        for known in self.static_token_digests:
            if hmac.compare_digest(digest, known):
                return digest
        return None

    def service_account(self, token: str) -> ServiceAccount | None:
        digest = token_digest(token)
        found = None
        for account in self.service_accounts:
            if hmac.compare_digest(digest, account.token_sha256):
                found = account
        return found

    def memberships_of(self, subject: str, groups: Iterable[str]) -> dict[str, str]:
        """The tenants an OIDC user belongs to, with the highest role any entry gives them."""
        group_set = set(groups)
        result: dict[str, str] = {}
        for tenant in self.tenants.values():
            for member in tenant.members:
                named = (member.subject and member.subject == subject) or (member.group and member.group in group_set)
                if named and not role_at_least(result.get(tenant.name), member.role):
                    result[tenant.name] = member.role
        return result

    def owner_of(self, namespace: str) -> str | None:
        """The tenant that owns `namespace` (the legacy tenant owns every namespace, "*")."""
        fallback = None
        for tenant in self.tenants.values():
            if namespace in tenant.namespaces:
                return tenant.name
            if _ALL in tenant.namespaces:
                fallback = tenant.name
        return fallback

    def scope(self, memberships: Mapping[str, str] | str | None) -> "Scope":
        if not self.enforced:
            return Scope(self, None)
        if isinstance(memberships, str) or memberships is None:
            memberships = decode_memberships(memberships or "")
        return Scope(self, {t: r for t, r in memberships.items() if t in self.tenants})


class Scope:
    """What one principal may see and do: a role per tenant, and through it per namespace.
    `memberships` None: not restricted (no policy file: one tenant owns everything)."""

    def __init__(self, policy: AuthPolicy, memberships: Mapping[str, str] | None):
        self._policy = policy
        self.memberships = memberships

    @property
    def unrestricted(self) -> bool:
        return self.memberships is None

    def tenant_of(self, namespace: str) -> str | None:
        return self._policy.owner_of(namespace)

    def role_in(self, namespace: str) -> str | None:
        if self.memberships is None:
            return "admin"
        tenant = self._policy.owner_of(namespace)
        return self.memberships.get(tenant) if tenant else None

    def can(self, namespace: str, role: str = "viewer") -> bool:
        return role_at_least(self.role_in(namespace), role)

    def best_role(self) -> str | None:
        if self.memberships is None:
            return "admin"
        return max(self.memberships.values(), key=lambda r: _RANK[r], default=None)

    def require(self, namespace: str, role: str, missing: str) -> str:
        """The tenant owning `namespace` when the principal has `role` there. Another tenant's
        (or nobody's) namespace raises NotFound(`missing`) — the sentence a stranger sees for
        something that does not exist; a lesser role in one's own tenant raises PermissionDenied."""
        have = self.role_in(namespace)
        if have is None:
            raise NotFound(missing)
        if not role_at_least(have, role):
            tenant = self.tenant_of(namespace) or LEGACY_TENANT
            raise PermissionDenied(f"this needs the {role} role in tenant {tenant!r}; you are {have} there")
        return self.tenant_of(namespace) or LEGACY_TENANT

    def require_namespace(self, namespace: str, role: str) -> str:
        """Like `require` for a namespace the caller names (to create in, or search): the same
        PERMISSION_DENIED sentence whether it is another tenant's or nobody's; a lesser role in
        one's own tenant is told which role it takes (the caller knows that tenant already)."""
        have = self.role_in(namespace)
        if have is not None and not role_at_least(have, role):
            tenant = self.tenant_of(namespace) or LEGACY_TENANT
            raise PermissionDenied(f"this needs the {role} role in tenant {tenant!r}; you are {have} there")
        if not role_at_least(have, role):
            mine = ", ".join(sorted(self.namespaces(role) or ())) or "none"
            raise PermissionDenied(
                f"namespace {namespace!r} is not one you may use as {role} (yours: {mine})"
            )
        return self.tenant_of(namespace) or LEGACY_TENANT

    def namespaces(self, role: str = "viewer") -> frozenset[str] | None:
        """The namespace patterns the principal reaches at `role`; None: every namespace."""
        if self.memberships is None:
            return None
        found: set[str] = set()
        for tenant, have in self.memberships.items():
            if role_at_least(have, role) and tenant in self._policy.tenants:
                found.update(self._policy.tenants[tenant].namespaces)
        return frozenset(found)

    def visible(self, namespace: str, role: str = "viewer") -> bool:
        return self.can(namespace, role)

    def default_namespace(self, role: str = "member") -> str:
        """Where a session goes when none is named: the home namespace of the caller's first
        tenant (by name) where they have `role`; "default" when not restricted."""
        if self.memberships is None:
            return "default"
        for tenant in sorted(self.memberships):
            if role_at_least(self.memberships[tenant], role):
                return self._policy.tenants[tenant].home_namespace
        raise PermissionDenied(f"this needs the {role} role in a tenant; you have it in none")

    def home_tenant(self, role: str) -> str:
        """The caller's first tenant (by name) where they have `role` (what a new job belongs to)."""
        if self.memberships is None:
            return LEGACY_TENANT
        for tenant in sorted(self.memberships):
            if role_at_least(self.memberships[tenant], role):
                return tenant
        raise PermissionDenied(f"this needs the {role} role in a tenant; you have it in none")


# The file's parser lives beside the model; re-exported so callers import one module.
from agentmesh.tenancy.policy_file import load_policy_file, parse_policy  # noqa: E402 - policy_file builds this module's classes, so it loads after them
