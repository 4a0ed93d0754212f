"""AGENTMESH_AUTH_POLICY, the file: YAML or JSON, checked entry by entry.

A malformed entry raises PolicyError with a sentence naming it (`tenants.acme.members[0].role
must be one of viewer, member, admin, got 'owner'`); the configuration loader adds the variable's
name, so start-up stops with it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from agentmesh.tenancy import (
    AuthPolicy,
    Member,
    OidcSettings,
    PolicyError,
    ServiceAccount,
    Tenant,
    TenantLimits,
)

__all__ = ["VALID_ROLES", "load_policy_file", "parse_policy"]

# The same three as agentmesh.tenancy.ROLES (a literal: this module is imported from there).
VALID_ROLES: tuple[str, ...] = ("viewer", "member", "admin")
_NAMESPACE_PATTERN = re.compile(r"^[A-Za-z0-9._:@-]{1,128}$")
_TENANT_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise PolicyError(f"{where} must be a mapping, got {type(value).__name__}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise PolicyError(f"{where} must be a list, got {type(value).__name__}")
    return value


def _text(entry: Mapping[str, Any], key: str, where: str, *, required: bool = True) -> str:
    value = entry.get(key)
    if value is None or value == "":
        if required:
            raise PolicyError(f"{where}: {key} is required")
        return ""
    if not isinstance(value, str):
        raise PolicyError(f"{where}.{key} must be a string, got {type(value).__name__}")
    return value


def _role(entry: Mapping[str, Any], where: str) -> str:
    role = _text(entry, "role", where)
    if role not in VALID_ROLES:
        raise PolicyError(f"{where}.role must be one of {', '.join(VALID_ROLES)}, got {role!r}")
    return role


def _unknown(entry: Mapping[str, Any], known: Iterable[str], where: str) -> None:
    extra = sorted(set(entry) - set(known))
    if extra:
        raise PolicyError(f"{where}: unknown key {extra[0]!r} (known: {', '.join(sorted(known))})")


def _oidc(raw: Any) -> OidcSettings:
    entry = _mapping(raw, "oidc")
    keys = ("issuer", "audience", "subject_claim", "name_claim", "groups_claim", "clock_skew_s",
            "jwks_refresh_min_s", "jwks_max_age_s", "algorithms")
    _unknown(entry, keys, "oidc")
    issuer = _text(entry, "issuer", "oidc").rstrip("/")
    if not issuer.startswith(("https://", "http://")):
        raise PolicyError(f"oidc.issuer must be an https:// URL, got {issuer!r}")
    skew = entry.get("clock_skew_s", 60)
    if not isinstance(skew, int) or not 0 <= skew <= 300:
        raise PolicyError(f"oidc.clock_skew_s must be a whole number of seconds from 0 to 300, got {skew!r}")
    algorithms = tuple(_list(entry.get("algorithms"), "oidc.algorithms")) or OidcSettings.algorithms
    refused = [a for a in algorithms if not isinstance(a, str) or a.lower() == "none" or a.upper().startswith("HS")]
    if refused:
        raise PolicyError(f"oidc.algorithms: {refused[0]!r} is refused (no 'none', no shared-secret HS* algorithms)")
    extra = {k: float(entry[k]) for k in ("jwks_refresh_min_s", "jwks_max_age_s") if k in entry}
    return OidcSettings(
        issuer=issuer,
        audience=_text(entry, "audience", "oidc"),
        subject_claim=_text(entry, "subject_claim", "oidc", required=False) or "sub",
        name_claim=_text(entry, "name_claim", "oidc", required=False) or "name",
        groups_claim=_text(entry, "groups_claim", "oidc", required=False) or "groups",
        clock_skew_s=skew,
        algorithms=algorithms,
        **extra,
    )


def _limits(raw: Any, where: str) -> TenantLimits:
    if raw is None:
        return TenantLimits()
    entry = _mapping(raw, f"{where}.limits")
    known = ("concurrent_turns", "tokens_per_day", "workspace_mb")
    _unknown(entry, known, f"{where}.limits")
    for key in known:
        value = entry.get(key, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise PolicyError(f"{where}.limits.{key} must be a whole number (0: no limit), got {value!r}")
    return TenantLimits(**{key: entry.get(key, 0) for key in known})


def _tenants(raw: Any) -> dict[str, Tenant]:
    tenants: dict[str, Tenant] = {}
    owners: dict[str, str] = {}
    for name, body in _mapping(raw, "tenants").items():
        where = f"tenants.{name}"
        if not isinstance(name, str) or not _TENANT_NAME.match(name):
            raise PolicyError(f"{where}: a tenant name is 1-63 characters of a-z, 0-9, '.', '_', '-'")
        entry = _mapping(body, where)
        _unknown(entry, ("namespaces", "members", "limits"), where)
        namespaces = _list(entry.get("namespaces"), f"{where}.namespaces")
        if not namespaces:
            raise PolicyError(f"{where}.namespaces: a tenant owns at least one namespace")
        for index, namespace in enumerate(namespaces):
            if not isinstance(namespace, str) or not _NAMESPACE_PATTERN.match(namespace):
                raise PolicyError(f"{where}.namespaces[{index}]: {namespace!r} is not a namespace "
                                  "(1-128 of A-Z a-z 0-9 . _ : @ -)")
            if namespace in owners:
                raise PolicyError(f"{where}.namespaces[{index}]: {namespace!r} is already owned by tenant {owners[namespace]!r}")
            owners[namespace] = name
        members = []
        for index, raw_member in enumerate(_list(entry.get("members"), f"{where}.members")):
            mwhere = f"{where}.members[{index}]"
            member = _mapping(raw_member, mwhere)
            _unknown(member, ("group", "subject", "role"), mwhere)
            group, subject = _text(member, "group", mwhere, required=False), _text(member, "subject", mwhere, required=False)
            if bool(group) == bool(subject):
                raise PolicyError(f"{mwhere}: give exactly one of group or subject")
            # Keycloak's group mapper sends full paths ("/team-a"); a leading '/' is not significant.
            members.append(Member(role=_role(member, mwhere), group=group.lstrip("/"), subject=subject))
        tenants[name] = Tenant(name, tuple(namespaces), tuple(members), _limits(entry.get("limits"), where))
    return tenants


def _service_accounts(raw: Any, tenants: Mapping[str, Tenant]) -> tuple[ServiceAccount, ...]:
    accounts = []
    names: set[str] = set()
    for index, raw_entry in enumerate(_list(raw, "service_accounts")):
        where = f"service_accounts[{index}]"
        entry = _mapping(raw_entry, where)
        _unknown(entry, ("name", "token_sha256", "tenant", "role"), where)
        name = _text(entry, "name", where)
        where = f"service_accounts[{index}] ({name})"
        if name in names:
            raise PolicyError(f"{where}: the name is used twice")
        names.add(name)
        digest = _text(entry, "token_sha256", where).lower()
        if not _SHA256_HEX.match(digest):
            raise PolicyError(f"{where}.token_sha256 must be 64 hex characters: the SHA-256 of the token "
                              "(printf %s \"$TOKEN\" | sha256sum), never the token itself")
        tenant = _text(entry, "tenant", where)
        if tenant not in tenants:
            raise PolicyError(f"{where}.tenant: no tenant {tenant!r} in tenants")
        accounts.append(ServiceAccount(name, digest, tenant, _role(entry, where)))
    return tuple(accounts)


def parse_policy(text: str, source: str = "the policy") -> AuthPolicy:
    """AGENTMESH_AUTH_POLICY's content (YAML, of which JSON is a subset)."""
    # Imported here: every process loads the settings (this module with them), few set a policy,
    # and PyYAML is a good part of the command line's start-up.
    import yaml  # type: ignore[import-untyped]  # PyYAML ships no type hints

    try:
        raw = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        raise PolicyError(f"{source} is neither YAML nor JSON: {exc}") from None
    entry = _mapping(raw or {}, source)
    _unknown(entry, ("oidc", "tenants", "service_accounts"), source)
    tenants = _tenants(entry.get("tenants") or {})
    if not tenants:
        raise PolicyError(f"{source}: tenants is empty; a policy names at least one tenant and its namespaces")
    accounts = _service_accounts(entry.get("service_accounts"), tenants)
    oidc = _oidc(entry["oidc"]) if entry.get("oidc") else None
    return AuthPolicy(tenants, accounts, oidc, enforced=True, source=source)


def load_policy_file(path: str) -> AuthPolicy:
    """Parse for the AGENTMESH_AUTH_POLICY setting: a file path (JSON or YAML)."""
    where = Path(path).expanduser()
    try:
        text = where.read_text()
    except OSError as exc:
        raise PolicyError(f"cannot read {where}: {exc.strerror}") from None
    return parse_policy(text, str(where))
