"""NetworkPolicies allow exactly the request path, judged by evaluating the rendered policies.

Every pair of components is tried on every port any of them serves; the connections that get
through must be precisely the ones the request path in docs/architecture.md (plus DNS, the API server, the model
and the collector, where configured) needs.
"""

from __future__ import annotations

import itertools

import pytest

from tests.helm.helm_support import NAMESPACE, PORTS, RELEASE, Endpoint, allowed, external, pod, render

QDRANT_PORTS = (6333, 6334)
ALL_PORTS = sorted({*PORTS.values(), *QDRANT_PORTS, 53, 443, 4317, 6443, 8080})
SANDBOX_NS = "agentmesh-sandbox"

KUBE_API = external("kube-api", "10.96.0.1")
MODEL = external("model", "203.0.113.10")
INTERNET = external("internet", "198.51.100.7")
DNS = pod("kube-dns", "kube-system", {"k8s-app": "kube-dns"}, ip="10.244.9.9")
COLLECTOR = pod("collector", "observability", {"app.kubernetes.io/name": "opentelemetry-collector"}, ip="10.244.8.8")
INGRESS = pod("ingress", "ingress-nginx", {"app.kubernetes.io/name": "ingress-nginx"}, ip="10.244.7.7")
STRANGER = pod("stranger", "default", {"app": "other"}, ip="10.244.6.6")


def component(rendered, name: str) -> Endpoint:
    workload = next(
        w for w in rendered.workloads() if w["metadata"]["labels"]["app.kubernetes.io/component"] == name
    )
    return pod(name, workload["metadata"]["namespace"], workload["spec"]["template"]["metadata"]["labels"])


def sandbox_pod(namespace: str, egress: str = "deny") -> Endpoint:
    # What the Job controller gives every pod of a Job, plus what the executor adds.
    return pod(f"sandbox-{egress}", namespace, {
        "batch.kubernetes.io/job-name": "call-1", "job-name": "call-1",
        "app.kubernetes.io/name": "agentmesh-sandbox", "agentmesh.io/egress": egress,
    })


def mcp_server_pod(namespace: str, egress: str = "deny") -> Endpoint:
    # What the tools service gives the pod of a stdio MCP server (no Job: no job-name label).
    return pod(f"mcp-{egress}", namespace, {
        "app.kubernetes.io/name": "agentmesh-sandbox", "app.kubernetes.io/managed-by": "agentmesh-tools",
        "app.kubernetes.io/component": "mcp-server", "agentmesh.io/mcp-server": "time", "agentmesh.io/egress": egress,
    })


def reachable(policies, endpoints) -> set[tuple[str, str, int]]:
    """Every (source, destination, port) that the policies let through, destinations being pods."""
    edges = set()
    for src, dst in itertools.permutations(endpoints, 2):
        if not dst.is_pod:
            continue
        for port in ALL_PORTS:
            if allowed(policies, src, dst, port):
                edges.add((src.name, dst.name, port))
    return edges


def egress_to(policies, src: Endpoint, dst: Endpoint, port: int) -> bool:
    return allowed(policies, src, dst, port)


SERVICE_EDGES = {
    ("gateway", "agent", 50052),
    ("gateway", "tools", 50053),
    ("gateway", "memory", 50054),
    ("agent", "tools", 50053),
    ("agent", "memory", 50054),
    ("scheduler", "gateway", 50051),
    ("memory", "qdrant", 6333),
    ("memory", "qdrant", 6334),
}


def test_default_policies_allow_exactly_the_request_path():
    r = render()
    policies = r.kind("NetworkPolicy")
    services = [component(r, c) for c in ("gateway", "agent", "tools", "memory", "scheduler", "qdrant")]
    sandbox = sandbox_pod(NAMESPACE)
    edges = reachable(policies, services + [sandbox])
    assert edges == SERVICE_EDGES

    # Anyone may call the gateway by default (clients, an ingress controller) - but nothing else.
    for outsider in (STRANGER, INGRESS, INTERNET):
        assert allowed(policies, outsider, services[0], 50051)
        assert allowed(policies, outsider, services[0], 8080)  # the HTTP API and web console
        for target in services[1:] + [sandbox]:
            assert not any(allowed(policies, outsider, target, port) for port in ALL_PORTS), target.name

    by_name = {s.name: s for s in services}
    # DNS for every service, not for Qdrant or the sandbox.
    for name, endpoint in by_name.items():
        assert allowed(policies, endpoint, DNS, 53, "UDP") is (name != "qdrant"), name
    assert not allowed(policies, sandbox, DNS, 53, "UDP")
    # The API server for tools (Jobs) and scheduler (Lease) only.
    for name, endpoint in by_name.items():
        assert egress_to(policies, endpoint, KUBE_API, 443) is (name in ("tools", "scheduler")), name
    # The scripted provider needs no model; only tools reaches the public web (web_fetch), and
    # never the cloud metadata endpoint.
    for endpoint in services + [sandbox]:
        assert egress_to(policies, endpoint, INTERNET, 443) is (endpoint.name == "tools"), endpoint.name
        assert not egress_to(policies, endpoint, external("metadata", "169.254.169.254"), 80), endpoint.name
    assert egress_to(policies, by_name["tools"], INTERNET, 80)
    assert not egress_to(policies, by_name["tools"], INTERNET, 22)
    # No telemetry egress without an endpoint.
    assert not egress_to(policies, by_name["agent"], COLLECTOR, 4317)


def test_a_real_model_and_a_collector_open_exactly_those_paths():
    r = render({
        "llm": {"provider": "openai", "baseUrl": "https://api.openai.com/v1", "model": "m"},
        "otel": {"endpoint": "http://collector.observability:4317"},
    })
    policies = r.kind("NetworkPolicy")
    by_name = {c: component(r, c) for c in ("gateway", "agent", "tools", "memory", "scheduler", "qdrant")}
    for name, endpoint in by_name.items():
        assert egress_to(policies, endpoint, MODEL, 443) is (name in ("agent", "tools")), name  # tools: web_fetch
        assert not egress_to(policies, endpoint, MODEL, 8443), name
        assert egress_to(policies, endpoint, COLLECTOR, 4317) is (name != "qdrant"), name
        assert not egress_to(policies, endpoint, COLLECTOR, 4318), name
    assert not egress_to(policies, sandbox_pod(NAMESPACE), MODEL, 443)


def test_web_fetch_egress_can_be_closed():
    r = render({"networkPolicy": {"webFetch": {"enabled": False}}})
    tools = component(r, "tools")
    assert not egress_to(r.kind("NetworkPolicy"), tools, INTERNET, 443)
    assert egress_to(r.kind("NetworkPolicy"), tools, KUBE_API, 443)


def test_the_model_port_follows_the_base_url():
    r = render({"llm": {"provider": "openai", "baseUrl": "http://ollama.llm:11434/v1", "model": "llama3.1"},
                "networkPolicy": {"modelTo": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "llm"}}}]}})
    ollama = pod("ollama", "llm", {"app": "ollama"})
    agent = component(r, "agent")
    assert allowed(r.kind("NetworkPolicy"), agent, ollama, 11434)
    assert not allowed(r.kind("NetworkPolicy"), agent, ollama, 443)
    assert not allowed(r.kind("NetworkPolicy"), agent, STRANGER, 11434)


def test_production_policies(production_render):
    r = production_render
    policies = r.kind("NetworkPolicy")
    services = [component(r, c) for c in ("gateway", "agent", "tools", "memory", "scheduler", "qdrant")]
    sandbox = sandbox_pod(SANDBOX_NS)
    assert reachable(policies, services + [sandbox]) == SERVICE_EDGES
    gateway, agent, tools = services[:3]
    # Only the ingress controller (and the scheduler) may call the gateway.
    assert allowed(policies, INGRESS, gateway, 50051)
    assert not allowed(policies, STRANGER, gateway, 50051)
    assert allowed(policies, INGRESS, gateway, 8080) and not allowed(policies, STRANGER, gateway, 8080)
    # Model egress is public internet only; web_fetch likewise (HTTPS only), from tools.
    assert egress_to(policies, agent, MODEL, 443)
    assert not egress_to(policies, tools, INTERNET, 80)
    assert not egress_to(policies, agent, external("metadata", "169.254.169.254"), 443)
    assert not egress_to(policies, agent, STRANGER, 443)
    assert egress_to(policies, tools, INTERNET, 443)
    assert not egress_to(policies, tools, external("private", "192.168.1.10"), 443)
    # The API server is reachable only inside the configured control-plane range.
    assert egress_to(policies, tools, external("api", "10.0.0.1"), 6443)
    assert not egress_to(policies, tools, external("elsewhere", "11.0.0.1"), 6443)
    # Telemetry goes to the collector pods only.
    assert egress_to(policies, agent, COLLECTOR, 4317)
    assert not egress_to(policies, agent, STRANGER, 4317)
    # Every pod in the sandbox namespace is sealed, whatever its labels.
    unlabelled = pod("bare", SANDBOX_NS, {})
    for target in (DNS, INTERNET, KUBE_API, gateway, COLLECTOR):
        for port in (53, 443, 50051, 4317):
            assert not allowed(policies, unlabelled, target, port)
    assert not any(allowed(policies, src, unlabelled, port) for src in services + [STRANGER] for port in ALL_PORTS)


@pytest.mark.parametrize("namespace", [NAMESPACE, SANDBOX_NS])
def test_sandbox_egress_is_opened_only_as_configured_and_only_for_networked_calls(namespace):
    rule = {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}}], "ports": [{"port": 443, "protocol": "TCP"}]}
    values = {"sandbox": {"networkPolicy": {"egress": [rule]}}}
    if namespace != NAMESPACE:
        values["sandbox"].update(namespace=namespace, workspace={"existingClaim": "ws", "accessModes": ["ReadWriteMany"]})
    r = render(values)
    policies = r.kind("NetworkPolicy")
    networked, offline = sandbox_pod(namespace, "allow"), sandbox_pod(namespace, "deny")
    assert allowed(policies, networked, INTERNET, 443)
    assert not allowed(policies, networked, INTERNET, 80)
    assert not allowed(policies, networked, KUBE_API, 443)
    assert not allowed(policies, offline, INTERNET, 443)
    # Still no way in, and the services' own rules are untouched.
    for sandbox in (networked, offline):
        assert not any(allowed(policies, STRANGER, sandbox, port) for port in ALL_PORTS)
    gateway = component(r, "gateway")
    assert not allowed(policies, networked, gateway, 50051)
    # A service pod that happened to carry the label gains nothing in the shared namespace.
    if namespace == NAMESPACE:
        labelled = pod("gateway", NAMESPACE, {**gateway.label_map, "agentmesh.io/egress": "allow"})
        assert not allowed(policies, labelled, INTERNET, 443)


@pytest.mark.parametrize("values", [{}, {"networkPolicy": {"enabled": False}}])
def test_the_sandbox_policy_is_always_rendered(values):
    r = render(values)
    (policy,) = [p for p in r.kind("NetworkPolicy") if p["metadata"]["name"] == f"{RELEASE}-sandbox"]
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert "ingress" not in policy["spec"] and "egress" not in policy["spec"]
    if values:
        # The service policies can be turned off, the sandbox's not (its Job pods and MCP server pods).
        assert sorted(p["metadata"]["name"] for p in r.kind("NetworkPolicy")) == [f"{RELEASE}-sandbox", f"{RELEASE}-sandbox-mcp"]


@pytest.mark.parametrize("which", ["default", "production"])
def test_gateway_replicas_reach_each_other_for_session_routing(which, default_render, production_render):
    r = default_render if which == "default" else production_render
    policies = r.kind("NetworkPolicy")
    gateway = component(r, "gateway")
    # Another replica of the same Deployment: same labels, another pod IP.
    peer = pod("gateway-2", gateway.namespace, gateway.label_map, ip="10.244.0.11")
    assert allowed(policies, gateway, peer, 50051) and allowed(policies, peer, gateway, 50051)
    assert not any(allowed(policies, gateway, peer, port) for port in ALL_PORTS if port != 50051)
    assert allowed(policies, gateway, DNS, 53, "UDP")  # it resolves its peers' headless Service
    # Opening gateway -> gateway opened nothing else towards the gateway.
    sandbox_ns = NAMESPACE if which == "default" else SANDBOX_NS
    for outsider in (sandbox_pod(sandbox_ns), sandbox_pod(sandbox_ns, "allow"), component(r, "agent"),
                     component(r, "tools"), component(r, "memory")):
        assert not allowed(policies, outsider, gateway, 50051), outsider.name
    if which == "production":  # there only the ingress controller and the scheduler call in
        assert not allowed(policies, STRANGER, gateway, 50051)
        assert not allowed(policies, pod("lookalike", "default", gateway.label_map), gateway, 50051)


@pytest.mark.parametrize("namespace", [NAMESPACE, SANDBOX_NS])
@pytest.mark.parametrize("egress_rule", [False, True])
def test_mcp_server_pods_are_sealed_like_sandbox_pods(namespace, egress_rule):
    rule = {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}}], "ports": [{"port": 443, "protocol": "TCP"}]}
    values: dict = {"sandbox": {"networkPolicy": {"egress": [rule] if egress_rule else []}}}
    if namespace != NAMESPACE:
        values["sandbox"].update(namespace=namespace, workspace={"existingClaim": "ws", "accessModes": ["ReadWriteMany"]})
    r = render(values)
    policies = r.kind("NetworkPolicy")
    networked, offline = mcp_server_pod(namespace, "allow"), mcp_server_pod(namespace, "deny")
    services = [component(r, c) for c in ("gateway", "agent", "tools", "memory")]
    # No way in (the tools service reaches a server through pods/attach, not the pod network).
    for server in (networked, offline):
        assert not any(allowed(policies, src, server, port) for src in services + [STRANGER] for port in ALL_PORTS)
        for target in services:
            assert not any(allowed(policies, server, target, port) for port in ALL_PORTS)
    # Out only for a server whose entry says "network": true, and only as sandbox.networkPolicy.egress allows.
    assert allowed(policies, networked, INTERNET, 443) is egress_rule
    assert not allowed(policies, networked, INTERNET, 80)
    assert not allowed(policies, offline, INTERNET, 443)
    assert not allowed(policies, networked, KUBE_API, 443) and not allowed(policies, networked, DNS, 53, "UDP")
