"""Who a user's bearer token names: a static token, a service account, or an OIDC sign-in.

Every service users reach (gateway, scheduler, memory, tools) resolves `authorization: Bearer`
the same way, into a `Principal` whose `tenant` field carries its tenants and roles
(`acme=member,beta=viewer`), so the principal is the same whichever door a user comes in by and
travels unchanged to the services behind it.

- AGENTMESH_AUTH_TOKENS: admin of the one tenant (no policy file) or of every tenant. Named
  `user:<fingerprint>` in logs and traces.
- service accounts of the policy file: the token's SHA-256 is compared (the token itself is
  kept nowhere); `service-account:<name>` with the entry's tenant and role.
- a JWT, when the policy configures `oidc`: checked against the issuer's keys (oidc.py);
  `oidc:<subject>` with the tenants its subject and groups are members of.
With no credential configured at all (the local default) every caller is `user:anonymous`,
admin of everything, as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentmesh.rpc.identity import Principal
from agentmesh.rpc.oidc import OidcError, OidcVerifier, looks_like_jwt
from agentmesh.tenancy import AuthPolicy, encode_memberships, token_digest

__all__ = ["ANONYMOUS", "Refusal", "UserAuthenticator"]

ANONYMOUS = Principal(subject="user:anonymous", tenant="")


@dataclass(frozen=True)
class Refusal:
    """Why a user's credential is not accepted: a sentence for the caller, and what the audit
    log records (never the token: `credential` is its fingerprint or the token's subject)."""

    reason: str
    credential: str = ""
    # Authenticated, but a member of no tenant: PERMISSION_DENIED rather than UNAUTHENTICATED.
    authenticated: bool = False


class UserAuthenticator:
    def __init__(self, policy: AuthPolicy, oidc: OidcVerifier | None = None):
        self.policy = policy
        self._oidc = oidc if oidc is not None else (OidcVerifier(policy.oidc) if policy.oidc else None)

    @property
    def enabled(self) -> bool:
        return self.policy.checks_users

    async def close(self) -> None:
        if self._oidc is not None:
            await self._oidc.close()

    async def authenticate(self, token: str | None) -> Principal | Refusal:
        if not self.enabled:
            return ANONYMOUS
        if not token:
            return Refusal("missing credentials: send 'authorization: Bearer <token>' "
                           "(the CLI: agentmesh login --token, or AGENTMESH_AUTH_TOKEN)")
        fingerprint = token_digest(token)[:12]
        if self.policy.static_token(token):
            return Principal(subject=f"user:{fingerprint}",
                             tenant=encode_memberships(self.policy.static_token_memberships()))
        account = self.policy.service_account(token)
        if account is not None:
            return Principal(subject=f"service-account:{account.name}",
                             tenant=encode_memberships({account.tenant: account.role}))
        if self._oidc is not None and looks_like_jwt(token):
            try:
                identity = await self._oidc.verify(token)
            except OidcError as exc:
                return Refusal(str(exc), credential=fingerprint)
            memberships = self.policy.memberships_of(identity.subject, identity.groups)
            subject = f"oidc:{identity.subject}"
            if not memberships:
                return Refusal(f"{identity.name or identity.subject} is signed in but a member of no tenant "
                               "(ask an administrator to add you or one of your groups)",
                               credential=subject, authenticated=True)
            return Principal(subject=subject, tenant=encode_memberships(memberships))
        return Refusal("the bearer token is not one this deployment accepts", credential=fingerprint)
