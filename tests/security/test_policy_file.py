"""AGENTMESH_AUTH_POLICY: a bad file stops start-up with a sentence naming the entry; a good
one gives each principal its tenants and roles; static tokens keep working without one."""

from __future__ import annotations

import json

import pytest

from agentmesh.config import ConfigError, Settings
from agentmesh.errors import NotFound, PermissionDenied
from agentmesh.tenancy import parse_policy, token_digest

GOOD = {
    "oidc": {"issuer": "https://id.example.com/realms/agents", "audience": "agentmesh", "groups_claim": "groups"},
    "tenants": {
        "acme": {"namespaces": ["acme", "acme-ops"], "members": [{"group": "/acme-devs", "role": "member"},
                                                                  {"subject": "ada", "role": "admin"}],
                 "limits": {"concurrent_turns": 2, "tokens_per_day": 1000}},
        "beta": {"namespaces": ["beta"], "members": [{"group": "beta", "role": "viewer"}]},
    },
    "service_accounts": [{"name": "ci", "token_sha256": token_digest("ci-token"), "tenant": "beta", "role": "member"}],
}


def _with(path: str, value) -> dict:
    policy = json.loads(json.dumps(GOOD))
    target = policy
    keys = path.split(".")
    for key in keys[:-1]:
        target = target[int(key)] if isinstance(target, list) else target[key]
    target[keys[-1] if not isinstance(target, list) else int(keys[-1])] = value
    return policy


@pytest.mark.parametrize(("path", "value", "sentence"), [
    ("tenants.acme.members.0.role", "owner", "tenants.acme.members[0].role must be one of viewer, member, admin"),
    ("tenants.beta.namespaces", ["acme"], "tenants.beta.namespaces[0]: 'acme' is already owned by tenant 'acme'"),
    ("service_accounts.0.token_sha256", "ci-token", "service_accounts[0] (ci).token_sha256 must be 64 hex characters"),
    ("service_accounts.0.tenant", "gamma", "service_accounts[0] (ci).tenant: no tenant 'gamma'"),
    ("oidc.algorithms", ["RS256", "HS256"], "oidc.algorithms: 'HS256' is refused"),
    ("tenants.acme.limits.tokens_per_day", -1, "tenants.acme.limits.tokens_per_day must be a whole number"),
    ("tenants.acme.colour", "red", "tenants.acme: unknown key 'colour'"),
])
def test_a_bad_entry_stops_start_up_naming_it(tmp_path, path, value, sentence):
    policy = tmp_path / "policy.yaml"
    policy.write_text(json.dumps(_with(path, value)))
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"AGENTMESH_AUTH_POLICY": str(policy)})
    assert str(refused.value).startswith("AGENTMESH_AUTH_POLICY: ") and sentence in str(refused.value)
    assert "ci-token" not in str(refused.value) or path == "service_accounts.0.token_sha256"


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"AGENTMESH_AUTH_POLICY: cannot read .*nope\.yaml"):
        Settings.from_env({"AGENTMESH_AUTH_POLICY": str(tmp_path / "nope.yaml")})


def test_memberships_scopes_and_the_two_refusals():
    policy = parse_policy(json.dumps(GOOD))
    assert policy.memberships_of("ada", ["acme-devs", "beta"]) == {"acme": "admin", "beta": "viewer"}
    assert policy.memberships_of("bob", ["acme-devs"]) == {"acme": "member"}
    assert policy.service_account("ci-token").tenant == "beta" and policy.service_account("other") is None
    scope = policy.scope({"acme": "member"})
    assert scope.default_namespace() == "acme" and scope.namespaces() == frozenset({"acme", "acme-ops"})
    assert scope.require("acme-ops", "member", "missing") == "acme"
    with pytest.raises(NotFound, match=r"^missing$"):
        scope.require("beta", "viewer", "missing")       # another tenant's: as if it did not exist
    with pytest.raises(PermissionDenied, match="needs the admin role in tenant 'acme'; you are member"):
        scope.require("acme", "admin", "missing")         # one's own, with too small a role


def test_static_tokens_without_a_policy_are_admins_of_everything():
    settings = Settings.from_env({"AGENTMESH_AUTH_TOKENS": "tok-1"})
    policy = settings.auth_policy
    assert policy.static_token("tok-1") and not policy.static_token("tok-2")
    assert policy.scope("default=admin").unrestricted and policy.checks_users
    assert not Settings.from_env({}).auth_policy.checks_users
