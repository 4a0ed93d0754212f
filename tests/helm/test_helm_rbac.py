"""RBAC grants exactly the Kubernetes API calls the code makes, and nothing to anyone else.

helm/agentmesh/rbac-calls.yaml lists the calls (client class, method, watch). For each, the
official `kubernetes` client is made to build its request - against a transport that records it
and sends nothing - and the request is turned into the RBAC (group, resource, verb) the API
server would authorize. The rendered Roles and RoleBindings must grant that set per service
account, exactly. A scan of services/ and lib/ keeps the list honest.
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import kubernetes.client
import pytest
import yaml

from tests.helm.helm_support import CHART, NAMESPACE, RELEASE, REPO_ROOT, Rendered, render

CALLS = yaml.safe_load((CHART / "rbac-calls.yaml").read_text())
API_USERS = tuple(CALLS)


class _Sent(Exception):
    pass


def request_of(api_name: str, method: str, watch: bool = False, args: dict | None = None) -> tuple[str, str]:
    """(HTTP method, URL) the client sends for `api_name.method(...)`."""
    client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host="https://kube.invalid"))
    sent: dict[str, str] = {}

    def record(http_method, url, *args, **kwargs):
        sent.update(method=http_method, url=url)
        raise _Sent

    client.rest_client.request = record
    bound = getattr(getattr(kubernetes.client, api_name)(client), method)
    kwargs = {}
    for param in inspect.signature(bound).parameters.values():
        if param.default is inspect.Parameter.empty and param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            kwargs[param.name] = {} if param.name == "body" else "x"
    kwargs.update(args or {})
    if watch:
        kwargs["watch"] = True
    with pytest.raises(_Sent):
        bound(**kwargs)
    return sent["method"], sent["url"]


def rbac_of(http_method: str, url: str) -> tuple[str, str, str]:
    """The (apiGroup, resource[/subresource], verb) RBAC checks for a namespaced request."""
    parts = urlsplit(url)
    segments = parts.path.strip("/").split("/")
    if segments[0] == "api":
        group, rest = "", segments[2:]
    else:
        group, rest = segments[1], segments[3:]
    assert rest[0] == "namespaces", f"not a namespaced request: {url}"
    resource, name, sub = rest[2], (rest[3] if len(rest) > 3 else None), (rest[4] if len(rest) > 4 else None)
    watching = parse_qs(parts.query).get("watch", ["false"])[0].lower() == "true"
    verb = {
        "GET": "get" if name else ("watch" if watching else "list"),
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if name else "deletecollection",
    }[http_method]
    return group, f"{resource}/{sub}" if sub else resource, verb


def uses_agent_sandbox(rendered: Rendered) -> bool:
    """Whether some template's session sandboxes are claimed from agent-sandbox (the default's, or
    one of the templates file's)."""
    if rendered.config().get("AGENTMESH_SANDBOX_AGENT_SANDBOX_POOL"):
        return True
    files = [m for m in rendered.kind("ConfigMap") if m["metadata"]["name"].endswith("-sandbox-templates")]
    return any(t.get("agent_sandbox_pool") for m in files
               for t in json.loads(m["data"]["templates.json"])["templates"].values() if t)


def required_grants(rendered: Rendered) -> set[tuple[str, str, str, str, str]]:
    managed = rendered.config().get("AGENTMESH_MANAGED_AGENT_NAMESPACES", "")
    sandbox = [rendered.config()["AGENTMESH_SANDBOX_NAMESPACE"]]
    namespaces = {"release": [NAMESPACE], "sandbox": sandbox, "agentResources": [n for n in managed.split(",") if n],
                  "agentSandbox": sandbox if uses_agent_sandbox(rendered) else []}
    grants = set()
    for service, entry in CALLS.items():
        for call in entry["calls"]:
            group, resource, verb = rbac_of(*request_of(call["api"], call["method"], call.get("watch", False),
                                                        call.get("args")))
            for namespace in namespaces[call.get("namespace", entry["namespace"])]:
                grants.add((f"{RELEASE}-{service}", namespace, group, resource, verb))
                if call.get("websocket"):
                    # A websocket upgrade (exec, attach, portforward) is authorized as "create" since 1.31.
                    grants.add((f"{RELEASE}-{service}", namespace, group, resource, "create"))
    return grants


def granted(rendered: Rendered) -> set[tuple[str, str, str, str, str]]:
    roles = {(r["metadata"]["namespace"], r["metadata"]["name"]): r for r in rendered.kind("Role")}
    grants = set()
    for binding in rendered.kind("RoleBinding"):
        namespace = binding["metadata"]["namespace"]
        assert binding["roleRef"]["kind"] == "Role"
        role = roles[(namespace, binding["roleRef"]["name"])]
        for subject in binding["subjects"]:
            assert subject["kind"] == "ServiceAccount" and subject["namespace"] == NAMESPACE
            for rule in role["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        for verb in rule["verbs"]:
                            grants.add((subject["name"], namespace, group, resource, verb))
    return grants


def test_the_request_mapping_is_right():
    """The derivation itself, on calls whose RBAC is well known."""
    assert rbac_of(*request_of("BatchV1Api", "list_namespaced_job", watch=True)) == ("batch", "jobs", "watch")
    assert rbac_of(*request_of("BatchV1Api", "list_namespaced_job")) == ("batch", "jobs", "list")
    assert rbac_of(*request_of("CoreV1Api", "read_namespaced_pod_log")) == ("", "pods/log", "get")
    assert rbac_of(*request_of("CoordinationV1Api", "replace_namespaced_lease")) == ("coordination.k8s.io", "leases", "update")
    assert rbac_of(*request_of("CoreV1Api", "delete_collection_namespaced_pod")) == ("", "pods", "deletecollection")
    assert rbac_of(*request_of("CoreV1Api", "connect_get_namespaced_pod_attach")) == ("", "pods/attach", "get")


def test_roles_grant_exactly_the_listed_calls(any_render):
    assert granted(any_render) == required_grants(any_render)


def test_the_agent_controller_gets_a_role_in_each_managed_namespace():
    rendered = render({"agentResources": {"namespaces": ["team-a", "team-b"]}})
    assert rendered.config()["AGENTMESH_MANAGED_AGENT_NAMESPACES"] == "team-a,team-b"
    grants = granted(rendered)
    assert grants == required_grants(rendered)
    for namespace in ("team-a", "team-b"):
        assert {g[2:] for g in grants if g[1] == namespace} == {
            ("agentmesh.dev", "agents", "list"), ("agentmesh.dev", "agents", "watch"),
            ("agentmesh.dev", "agents/status", "patch"),
            ("agentmesh.dev", "modelconfigs", "list"), ("agentmesh.dev", "modelconfigs", "watch"),
            ("agentmesh.dev", "modelconfigs/status", "patch")}
        assert {g[0] for g in grants if g[1] == namespace} == {f"{RELEASE}-scheduler"}


@pytest.mark.parametrize("values", [{"sandbox": {"agentSandboxPool": "python-pool", "isolation": "session"}},
                                    {"sandbox": {"templates": {"claimed": {"isolation": "session",
                                                                           "agent_sandbox_pool": "python-pool"}}}}])
def test_agent_sandbox_claims_are_granted_only_where_a_template_uses_them(values):
    rendered = render(values)
    grants = granted(rendered)
    assert grants == required_grants(rendered)
    claims = {g[2:] for g in grants if g[2] in ("extensions.agents.x-k8s.io", "agents.x-k8s.io")}
    assert claims == {("extensions.agents.x-k8s.io", "sandboxclaims", verb) for verb in ("create", "list", "watch", "delete")} | {
        ("agents.x-k8s.io", "sandboxes", "get")}
    assert not {g for g in granted(render()) if g[2] in ("extensions.agents.x-k8s.io", "agents.x-k8s.io")}


def test_nothing_else_gets_api_access(any_render):
    assert any_render.kind("ClusterRole") == [] and any_render.kind("ClusterRoleBinding") == []
    for role in any_render.kind("Role"):
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], role["metadata"]["name"]
            assert "secrets" not in rule["resources"]
    holders = {grant[0] for grant in granted(any_render)}
    assert holders == {f"{RELEASE}-{s}" for s in API_USERS}


# --- the list matches the code ------------------------------------------------------------------

def _api_methods() -> set[str]:
    """Every request method of the client's generated API classes, read from their source (importing
    them all takes seconds)."""
    api_dir = Path(kubernetes.client.__file__).parent / "api"
    names = set()
    for path in api_dir.glob("*_api.py"):
        names.update(re.findall(r"^    def ((?:create|read|get|list|replace|patch|delete|connect)_\w+)\(", path.read_text(), re.M))
    return {n for n in names if not n.endswith(("_with_http_info", "_without_preload_content"))}


API_METHODS = _api_methods()
# Leader-election helpers in the client make their calls out of sight of a name scan.
INDIRECT = {"LeaseLock": {"read_namespaced_lease", "create_namespaced_lease", "replace_namespaced_lease"}}


def api_calls_in_code() -> dict[str, set[str]]:
    """owner (service name, or a path outside services/) -> kubernetes client methods its code names."""
    found: dict[str, set[str]] = {}
    for root in ("services", "lib", "cli"):
        for path in sorted((REPO_ROOT / root).rglob("*.py")):
            text = path.read_text(errors="replace")
            names = {n for n in re.findall(r"\b[a-z][a-z0-9_]+\b", text) if n in API_METHODS}
            for marker, implied in INDIRECT.items():
                if re.search(rf"\b{marker}\b", text):
                    names |= implied
            if names:
                rel = path.relative_to(REPO_ROOT)
                owner = rel.parts[1] if rel.parts[0] == "services" else str(rel)
                found.setdefault(owner, set()).update(names)
    return found


def listed(service: str) -> set[str]:
    return {call["method"] for call in CALLS.get(service, {}).get("calls", [])}


def test_only_tools_and_scheduler_code_calls_the_api():
    owners = set(api_calls_in_code())
    assert owners <= set(API_USERS), f"Kubernetes API calls outside tools/scheduler: {owners - set(API_USERS)}"


@pytest.mark.parametrize("service", API_USERS)
def test_every_call_in_the_code_is_listed(service):
    unlisted = api_calls_in_code().get(service, set()) - listed(service)
    assert not unlisted, f"services/{service} calls {sorted(unlisted)}: add them to helm/agentmesh/rbac-calls.yaml"


@pytest.mark.parametrize("service", API_USERS)
def test_every_listed_call_is_still_made(service):
    in_code = api_calls_in_code().get(service)
    if not in_code:
        pytest.skip(f"services/{service} makes no Kubernetes API calls yet")
    stale = listed(service) - in_code
    assert not stale, f"rbac-calls.yaml grants {service} {sorted(stale)} that its code no longer calls"
