"""The chart renders, lints clean, and every object is valid and wired the way the services expect."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import helm_python
import kubernetes_validate
import pytest

from tests.helm.helm_support import CHART, NAMESPACE, PORTS, RELEASE, SERVICES, Rendered, container_env, render

CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass", "StorageClass", "CustomResourceDefinition"}
API_USERS = {"tools", "scheduler"}


def pod_specs(rendered: Rendered):
    for workload in rendered.workloads():
        yield workload, workload["spec"]["template"]["spec"]


# --- lint and schema validity -----------------------------------------------------------------


@pytest.mark.parametrize("which", ["default", "production"])
def test_lint_is_clean(which, production_values):
    values = None if which == "default" else production_values
    report = helm_python.lint(str(CHART), values, strict=True, namespace=NAMESPACE, kube_version="v1.30.0")
    assert report["errors"] == []
    assert report["messages"] == [], report["messages"]


@pytest.mark.parametrize("kube_version", ["1.30.0", kubernetes_validate.latest_version()])
def test_every_manifest_is_valid_kubernetes(any_render, kube_version):
    assert len(any_render.objects) > 30
    problems = []
    for obj in any_render.objects:
        try:
            kubernetes_validate.validate(obj, kube_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            problems.append(f"{obj['kind']}/{obj['metadata']['name']}: {path}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            problems.append(exc.message)
    assert problems == []


def test_namespaced_objects_name_their_namespace(any_render):
    for obj in any_render.objects:
        if obj["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in obj["metadata"]
        else:
            assert obj["metadata"].get("namespace"), f"{obj['kind']}/{obj['metadata']['name']} has no namespace"


def test_the_chart_renders_every_component(default_render):
    r = default_render
    for service in SERVICES:
        r.deployment(service)
        assert r.get("Service", f"{RELEASE}-{service}")["spec"]["ports"][0]["port"] == PORTS[service]
        r.get("ServiceAccount", f"{RELEASE}-{service}")
    r.get("StatefulSet", f"{RELEASE}-qdrant")
    r.get("ServiceAccount", f"{RELEASE}-qdrant")
    r.get("PersistentVolumeClaim", f"{RELEASE}-workspaces")
    r.get("PersistentVolumeClaim", f"{RELEASE}-scheduler-data")
    assert {h["metadata"]["name"] for h in r.kind("HorizontalPodAutoscaler")} == {
        f"{RELEASE}-gateway", f"{RELEASE}-agent", f"{RELEASE}-memory"
    }
    # Nothing secret was given: the only Secrets are the services' own signing keys.
    assert {s["metadata"]["name"] for s in r.kind("Secret")} == {f"{RELEASE}-{s}-key" for s in SERVICES}
    assert r.kind("ClusterRole") == [] and r.kind("ClusterRoleBinding") == []


# --- hardened pods ----------------------------------------------------------------------------


def test_every_pod_is_hardened(any_render):
    seen = 0
    for workload, spec in pod_specs(any_render):
        name = workload["metadata"]["name"]
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert spec["securityContext"].get("runAsUser", 1) != 0
        assert spec.get("enableServiceLinks") is False, name  # no AGENTMESH_* env from Service links
        assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
        assert all("hostPath" not in v for v in spec.get("volumes", []))
        for container in spec["containers"] + spec.get("initContainers", []):
            sc = container["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, name
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["privileged"] is False, name
            assert sc["runAsNonRoot"] is True, name
            assert sc["capabilities"] == {"drop": ["ALL"]}, name
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container["resources"][bound]), f"{name} {bound}"
            seen += 1
    assert seen == 6


def test_only_tools_and_scheduler_get_an_api_token(any_render):
    for workload, spec in pod_specs(any_render):
        component = workload["metadata"]["labels"]["app.kubernetes.io/component"]
        assert spec["automountServiceAccountToken"] is (component in API_USERS), component
        assert spec["serviceAccountName"] == f"{RELEASE}-{component}"
    for account in any_render.kind("ServiceAccount"):
        assert account["automountServiceAccountToken"] is False


# --- services: command, ports, probes, addresses ----------------------------------------------


@pytest.mark.parametrize("service", SERVICES)
def test_each_service_runs_its_command_with_native_grpc_probes(default_render, service):
    deployment = default_render.deployment(service)
    pod_spec = deployment["spec"]["template"]["spec"]
    (container,) = pod_spec["containers"]
    port = PORTS[service]
    assert container["command"] == ["agentmesh", "serve"] and container["args"] == [service]
    expected = [{"name": "grpc", "containerPort": port, "protocol": "TCP"}]
    if service == "gateway":  # the HTTP API and web console beside gRPC
        expected.append({"name": "http", "containerPort": 8080, "protocol": "TCP"})
    assert container["ports"] == expected
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"] == {"port": port}, probe
    env = container_env(container)
    assert env["AGENTMESH_LISTEN_ADDR"] == f"0.0.0.0:{port}"
    assert env["OTEL_SERVICE_NAME"] == f"agentmesh-{service}"
    # SIGTERM drain fits inside the grace period, after the preStop pause.
    drain = float(env["AGENTMESH_DRAIN_S"])
    assert pod_spec["terminationGracePeriodSeconds"] >= drain + container["lifecycle"]["preStop"]["sleep"]["seconds"]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/var/lib/agentmesh", "/tmp"} <= mounts
    assert default_render.config()["AGENTMESH_HOME"] == "/var/lib/agentmesh"


@pytest.mark.parametrize("service", SERVICES)
def test_peer_addresses_reach_the_right_pods(default_render, service):
    """AGENTMESH_<SVC>_ADDR names a Service whose port leads to that service's container."""
    host, _, port = default_render.config()[f"AGENTMESH_{service.upper()}_ADDR"].rpartition(":")
    name, namespace, suffix = host.split(".")
    assert (namespace, suffix, int(port)) == (NAMESPACE, "svc", PORTS[service])
    svc = default_render.get("Service", name)
    pod_labels = default_render.deployment(service)["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    svc_port = svc["spec"]["ports"][0]
    assert svc_port["port"] == PORTS[service] and svc_port["targetPort"] == "grpc"
    assert [p["name"] for p in svc["spec"]["ports"]] == (["grpc", "http"] if service == "gateway" else ["grpc"])
    # ... and no other Deployment's pods match that selector.
    others = [s for s in SERVICES if s != service]
    for other in others:
        labels = default_render.deployment(other)["spec"]["template"]["metadata"]["labels"]
        assert not svc["spec"]["selector"].items() <= labels.items()


def test_config_changes_roll_the_pods():
    before = render().deployment("agent")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    after = render({"logLevel": "debug"}).deployment("agent")["spec"]["template"]["metadata"]["annotations"]
    assert after["checksum/config"] != before


# --- secrets ----------------------------------------------------------------------------------

MODEL_KEY = "sk-test-model-key-0123456789"
TOKENS = ["tok-aaaaaaaaaaaaaaaaaaaa", "tok-bbbbbbbbbbbbbbbbbbbb"]


def test_the_model_key_reaches_only_the_agent_and_only_through_a_secret():
    r = render({"llm": {"provider": "openai", "baseUrl": "https://api.openai.com/v1", "model": "gpt-4o-mini",
                        "apiKey": MODEL_KEY}})
    secret = r.get("Secret", RELEASE)
    assert base64.b64decode(secret["data"]["api-key"]).decode() == MODEL_KEY
    for path, text in r.files.items():
        assert MODEL_KEY not in text, f"the key appears in clear in {path}"
    for service in SERVICES:
        env = container_env(r.deployment(service)["spec"]["template"]["spec"]["containers"][0])
        if service == "agent":
            assert env["AGENTMESH_LLM_API_KEY"] == {"secretKeyRef": {"name": RELEASE, "key": "api-key"}}
        else:
            assert "AGENTMESH_LLM_API_KEY" not in env, service
    config = r.config()
    assert config["AGENTMESH_LLM_PROVIDER"] == "openai"
    assert config["AGENTMESH_LLM_BASE_URL"] == "https://api.openai.com/v1"
    assert not any("KEY" in k or "TOKEN" in k for k in config)


def test_an_existing_secret_is_used_instead_of_a_chart_secret():
    r = render({"llm": {"provider": "anthropic", "baseUrl": "https://api.anthropic.com", "model": "claude",
                        "existingSecret": "my-llm", "secretKey": "token"}})
    assert [s for s in r.kind("Secret") if s["type"] != "kubernetes.io/tls"] == []
    env = container_env(r.deployment("agent")["spec"]["template"]["spec"]["containers"][0])
    assert env["AGENTMESH_LLM_API_KEY"] == {"secretKeyRef": {"name": "my-llm", "key": "token"}}


def test_user_tokens_reach_the_services_users_call_and_no_other():
    r = render({"auth": {"tokens": TOKENS}})
    data = r.get("Secret", RELEASE)["data"]
    assert base64.b64decode(data["auth-tokens"]).decode() == ",".join(TOKENS)
    assert base64.b64decode(data["client-token"]).decode() == TOKENS[0]
    gateway = container_env(r.deployment("gateway")["spec"]["template"]["spec"]["containers"][0])
    scheduler = container_env(r.deployment("scheduler")["spec"]["template"]["spec"]["containers"][0])
    assert gateway["AGENTMESH_AUTH_TOKENS"] == {"secretKeyRef": {"name": RELEASE, "key": "auth-tokens"}}
    # The scheduler's job API, and `agentmesh tools|memory`, take the same tokens; the scheduler
    # itself reaches the gateway with its service key, not a user's token.
    for service in ("scheduler", "tools", "memory"):
        env = container_env(r.deployment(service)["spec"]["template"]["spec"]["containers"][0])
        assert env["AGENTMESH_AUTH_TOKENS"] == {"secretKeyRef": {"name": RELEASE, "key": "auth-tokens"}}
    assert "AGENTMESH_AUTH_TOKEN" not in scheduler
    agent = container_env(r.deployment("agent")["spec"]["template"]["spec"]["containers"][0])
    assert not {"AGENTMESH_AUTH_TOKENS", "AGENTMESH_AUTH_TOKEN"} & set(agent)
    assert "AGENTMESH_AUTH_TOKEN=" in r.notes


def test_embeddings_settings_reach_only_the_memory_service():
    r = render({"memory": {"embeddings": {"embedder": "openai", "baseUrl": "https://api.openai.com/v1",
                                          "model": "text-embedding-3-small", "apiKey": MODEL_KEY}}})
    env = container_env(r.deployment("memory")["spec"]["template"]["spec"]["containers"][0])
    assert env["AGENTMESH_EMBEDDER"] == "openai"
    assert env["AGENTMESH_EMBEDDINGS_MODEL"] == "text-embedding-3-small"
    assert env["AGENTMESH_EMBEDDINGS_API_KEY"] == {"secretKeyRef": {"name": RELEASE, "key": "embeddings-api-key"}}
    assert MODEL_KEY not in json.dumps(r.objects)


# --- sandbox, Qdrant, scheduler, telemetry ------------------------------------------------------


def test_tools_mounts_the_workspace_claim_the_sandbox_pods_are_told_about(any_render):
    config = any_render.config()
    assert config["AGENTMESH_SANDBOX"] == "kubernetes"
    claim = config["AGENTMESH_SANDBOX_WORKSPACE_PVC"]
    spec = any_render.deployment("tools")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0]["volumeMounts"]}
    # The tools service keeps workspaces at $AGENTMESH_HOME/workspaces/<session>; sandbox pods
    # mount the same claim with subPath <session>, so the claim's root must be that directory.
    workspaces = volumes[mounts[config["AGENTMESH_HOME"] + "/workspaces"]]
    assert workspaces["persistentVolumeClaim"]["claimName"] == claim
    assert "emptyDir" in volumes[mounts[config["AGENTMESH_HOME"]]]
    assert config["AGENTMESH_SANDBOX_IMAGE"].startswith(("ghcr.io/agentmesh/agentmesh-sandbox:", "registry.example.com/"))


def test_the_workspace_quota_reaches_the_tools_service(default_render):
    assert default_render.config()["AGENTMESH_TOOLS_WORKSPACE_QUOTA_MB"] == "1024"
    config = render({"sandbox": {"workspace": {"quotaMB": 256}}}).config()
    assert config["AGENTMESH_TOOLS_WORKSPACE_QUOTA_MB"] == "256"
    # The tools service reads it as its quota.
    from agentmesh.tools.settings import ToolsSettings

    assert ToolsSettings.from_env(config, home=Path("/var/lib/agentmesh")).workspace_quota_bytes == 256 * 1024 * 1024


def test_session_pods_and_their_warm_pool_are_values_of_the_chart(default_render):
    from agentmesh.tools.settings import ToolsSettings

    default = ToolsSettings.from_env(default_render.config(), home=Path("/var/lib/agentmesh"), mode="kubernetes")
    assert default.isolation == "call" and default.kubernetes.warm_pool_max == 0
    config = render({"sandbox": {"isolation": "session", "sessionIdleSeconds": 300,
                                 "warmPool": {"min": 1, "max": 4, "idleSeconds": 120}}}).config()
    settings = ToolsSettings.from_env(config, home=Path("/var/lib/agentmesh"), mode="kubernetes")
    assert settings.isolation == "session" and settings.session_idle_s == 300
    pool = settings.kubernetes
    assert (pool.warm_pool_min, pool.warm_pool_max, pool.warm_pool_idle_s) == (1, 4, 120)


def test_default_sandbox_lives_in_the_release_namespace(default_render):
    config = default_render.config()
    assert config["AGENTMESH_SANDBOX_NAMESPACE"] == NAMESPACE
    assert "AGENTMESH_SANDBOX_RUNTIME_CLASS" not in config
    default_render.get("PersistentVolumeClaim", config["AGENTMESH_SANDBOX_WORKSPACE_PVC"])
    assert default_render.kind("Namespace") == [] and default_render.kind("ResourceQuota") == []


def test_production_sandbox_is_a_dedicated_restricted_namespace(production_render, production_values):
    config = production_render.config()
    sandbox_ns = production_values["sandbox"]["namespace"]
    assert config["AGENTMESH_SANDBOX_NAMESPACE"] == sandbox_ns != NAMESPACE
    assert config["AGENTMESH_SANDBOX_RUNTIME_CLASS"] == "gvisor"
    namespace = production_render.get("Namespace", sandbox_ns)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for kind in ("LimitRange", "ResourceQuota", "NetworkPolicy"):
        assert any(o["metadata"]["namespace"] == sandbox_ns for o in production_render.kind(kind)), kind
    # The claim is the operator's (it must exist in both namespaces); the chart makes none.
    assert production_render.find("PersistentVolumeClaim", config["AGENTMESH_SANDBOX_WORKSPACE_PVC"]) is None


def test_qdrant_in_the_release_is_what_memory_is_pointed_at(default_render):
    url = default_render.config()["AGENTMESH_QDRANT_URL"]
    assert url == f"http://{RELEASE}-qdrant.{NAMESPACE}.svc:6333"
    svc = default_render.get("Service", f"{RELEASE}-qdrant")
    assert {p["port"] for p in svc["spec"]["ports"]} == {6333, 6334}
    sts = default_render.get("StatefulSet", f"{RELEASE}-qdrant")
    assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "storage"
    assert svc["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()


def test_an_external_qdrant_replaces_the_statefulset():
    r = render({"qdrant": {"enabled": False}, "externalQdrant": {"url": "https://qdrant.example.com:6333"}})
    assert r.kind("StatefulSet") == []
    assert r.config()["AGENTMESH_QDRANT_URL"] == "https://qdrant.example.com:6333"


def test_scheduler_uses_a_lease_its_role_is_limited_to(default_render):
    config = default_render.config()
    assert config["AGENTMESH_SCHEDULER_LOCK"] == "lease"
    assert config["AGENTMESH_SCHEDULER_NAMESPACE"] == NAMESPACE
    role = default_render.get("Role", f"{RELEASE}-scheduler-lease")
    named = [rule for rule in role["rules"] if rule.get("resourceNames")]
    assert named and all(rule["resourceNames"] == [config["AGENTMESH_SCHEDULER_LEASE_NAME"]] for rule in named)
    deployment = default_render.deployment("scheduler")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"  # its RWO volume cannot be shared


def test_otlp_endpoint_turns_on_export_for_every_service():
    r = render({"otel": {"endpoint": "http://collector.observability:4317", "resourceAttributes": {"team": "ml"}}})
    config = r.config()
    assert config["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://collector.observability:4317"
    assert config["AGENTMESH_TRACES"] == "otlp"
    for service in SERVICES:
        env = container_env(r.deployment(service)["spec"]["template"]["spec"]["containers"][0])
        assert "team=ml" in env["OTEL_RESOURCE_ATTRIBUTES"]
        assert f"k8s.deployment.name={RELEASE}-{service}" in env["OTEL_RESOURCE_ATTRIBUTES"]
    assert render().config()["AGENTMESH_TRACES"] == "none"


# --- scaling and disruption -----------------------------------------------------------------


def test_autoscaled_deployments_leave_replicas_to_their_hpa(any_render):
    for hpa in any_render.kind("HorizontalPodAutoscaler"):
        target = hpa["spec"]["scaleTargetRef"]
        deployment = any_render.get(target["kind"], target["name"])
        assert "replicas" not in deployment["spec"], target["name"]
        assert hpa["spec"]["metrics"], target["name"]
    autoscaled = {h["spec"]["scaleTargetRef"]["name"] for h in any_render.kind("HorizontalPodAutoscaler")}
    assert f"{RELEASE}-scheduler" not in autoscaled  # one firing instance, never scaled by load


def test_disruption_budgets_cover_replicated_services_only(any_render):
    budgets = {p["metadata"]["name"]: p for p in any_render.kind("PodDisruptionBudget")}
    for service in SERVICES:
        deployment = any_render.deployment(service)
        hpa = any_render.find("HorizontalPodAutoscaler", f"{RELEASE}-{service}")
        replicas = hpa["spec"]["minReplicas"] if hpa else deployment["spec"]["replicas"]
        name = f"{RELEASE}-{service}"
        if replicas > 1:
            selector = budgets[name]["spec"]["selector"]["matchLabels"]
            assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
        else:
            assert name not in budgets  # a budget on one replica would block node drains


def test_grafana_dashboards_are_shipped_for_the_sidecar():
    dashboards = sorted(p.name for p in (CHART / "dashboards").glob("*.json"))
    r = render({"grafanaDashboard": {"enabled": True}})
    configmap = r.find("ConfigMap", f"{RELEASE}-dashboards")
    if not dashboards:
        assert configmap is None
        return
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert sorted(configmap["data"]) == dashboards
    for name in dashboards:
        assert json.loads(configmap["data"][name]) == json.loads((CHART / "dashboards" / name).read_text())
    assert render().find("ConfigMap", f"{RELEASE}-dashboards") is None


def test_notes_tell_how_to_reach_the_gateway_and_chat(default_render):
    notes = default_render.notes
    assert f"port-forward svc/{RELEASE}-gateway 50051:50051" in notes
    assert "AGENTMESH_GATEWAY_ADDR=127.0.0.1:50051" in notes
    assert "agentmesh chat" in notes
    assert "scripted" in notes  # says the default answers are canned


# --- gateway session routing ------------------------------------------------------------------


def test_gateway_replicas_find_each_other_through_a_headless_service(any_render):
    r = any_render
    (container,) = r.deployment("gateway")["spec"]["template"]["spec"]["containers"]
    env = container_env(container)
    names = [e["name"] for e in container["env"]]
    # $(POD_IP) expands only if POD_IP is defined before it.
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert names.index("POD_IP") < names.index("AGENTMESH_GATEWAY_ADVERTISE_ADDR")
    assert env["AGENTMESH_GATEWAY_ADVERTISE_ADDR"] == f"$(POD_IP):{PORTS['gateway']}"
    scheme, _, target = env["AGENTMESH_GATEWAY_PEERS"].partition("///")
    host, _, port = target.rpartition(":")
    name, namespace, suffix = host.split(".")
    assert (scheme, namespace, suffix, int(port)) == ("dns:", NAMESPACE, "svc", PORTS["gateway"])

    peers = r.get("Service", name)
    assert peers["spec"]["clusterIP"] == "None"  # DNS answers with every pod's IP
    assert not peers["spec"].get("publishNotReadyAddresses")  # a draining pod drops out
    (svc_port,) = peers["spec"]["ports"]
    assert svc_port["port"] == PORTS["gateway"] and svc_port["targetPort"] == "grpc"
    gateway_labels = r.deployment("gateway")["spec"]["template"]["metadata"]["labels"]
    assert peers["spec"]["selector"].items() <= gateway_labels.items()
    for other in SERVICES:
        if other != "gateway":
            labels = r.deployment(other)["spec"]["template"]["metadata"]["labels"]
            assert not peers["spec"]["selector"].items() <= labels.items(), other
            other_env = container_env(r.deployment(other)["spec"]["template"]["spec"]["containers"][0])
            assert "AGENTMESH_GATEWAY_PEERS" not in other_env, other
    # The peers' Service is for the replicas only: nothing is pointed at it but them.
    assert name not in r.config().get("AGENTMESH_GATEWAY_ADDR", "")


def test_the_gateway_settings_the_chart_renders_are_accepted_by_the_gateway(default_render):
    from agentmesh.gateway.settings import GatewaySettings

    env = container_env(default_render.deployment("gateway")["spec"]["template"]["spec"]["containers"][0])
    # What the kubelet makes of $(POD_IP) in a pod, on an IPv4 and an IPv6 cluster.
    for pod_ip, advertised in (("10.244.1.7", "10.244.1.7:50051"), ("fd00:10:244::7", "[fd00:10:244::7]:50051")):
        settings = GatewaySettings.from_env({
            "AGENTMESH_GATEWAY_PEERS": env["AGENTMESH_GATEWAY_PEERS"],
            "AGENTMESH_GATEWAY_ADVERTISE_ADDR": env["AGENTMESH_GATEWAY_ADVERTISE_ADDR"].replace("$(POD_IP)", pod_ip),
        })
        assert settings.advertise_address == advertised
        assert settings.peers.dns_name == f"{RELEASE}-gateway-peers.{NAMESPACE}.svc"
        assert settings.peers.dns_port == PORTS["gateway"]


# --- the gateway's HTTP API and web console -------------------------------------------------


def test_the_gateway_serves_http_on_its_service_and_ingress(default_render):
    container = default_render.deployment("gateway")["spec"]["template"]["spec"]["containers"][0]
    assert container_env(container)["AGENTMESH_GATEWAY_HTTP_ADDR"] == "0.0.0.0:8080"
    svc = default_render.get("Service", f"{RELEASE}-gateway")
    http = next(p for p in svc["spec"]["ports"] if p["name"] == "http")
    assert (http["port"], http["targetPort"]) == (8080, "http")

    values = {"auth": {"tokens": ["t0ken-for-the-ingress"]}, "gateway": {"ingress": {"enabled": True}}}
    ingress = render(values).get("Ingress", f"{RELEASE}-gateway")
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": f"{RELEASE}-gateway", "port": {"name": "http"}}
    grpc_values = {**values, "gateway": {"ingress": {"enabled": True, "servicePort": "grpc"}}}
    grpc_backend = render(grpc_values).get("Ingress", f"{RELEASE}-gateway")["spec"]["rules"][0]["http"]["paths"][0]["backend"]
    assert grpc_backend["service"]["port"] == {"name": "grpc"}


def test_http_can_be_turned_off(default_render):
    off = render({"gateway": {"http": {"enabled": False}}})
    container = off.deployment("gateway")["spec"]["template"]["spec"]["containers"][0]
    assert container_env(container)["AGENTMESH_GATEWAY_HTTP_ADDR"] == "off"
    assert [p["name"] for p in container["ports"]] == ["grpc"]
    assert [p["name"] for p in off.get("Service", f"{RELEASE}-gateway")["spec"]["ports"]] == ["grpc"]


POLICY_VALUES = {"auth": {"policy": {
    "oidc": {"issuer": "https://keycloak.example.com/realms/agents", "audience": "agentmesh", "groupsClaim": "groups"},
    "tenants": {"acme": {"namespaces": ["acme"], "members": [{"group": "acme-devs", "role": "member"}],
                         "limits": {"concurrent_turns": 4}},
                "beta": {"namespaces": ["beta"], "members": [{"group": "beta", "role": "viewer"}]}},
    "serviceAccounts": [{"name": "nightly-ci", "tenant": "acme", "role": "member"}],
    "serviceAccountHashes": {"nightly-ci": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"},
}}}


def test_the_policy_renders_from_values_into_a_secret_the_services_accept():
    from agentmesh.tenancy import parse_policy

    r = render(POLICY_VALUES)
    secret = r.get("Secret", f"{RELEASE}-auth-policy")
    text = base64.b64decode(secret["data"]["policy.yaml"]).decode()
    policy = parse_policy(text)  # the services' own parser accepts what the chart renders
    assert policy.oidc is not None and policy.oidc.issuer == "https://keycloak.example.com/realms/agents"
    assert policy.memberships_of("ada", ["acme-devs"]) == {"acme": "member"}
    assert policy.service_accounts[0].tenant == "acme" and policy.tenants["acme"].limits.concurrent_turns == 4
    for service in SERVICES:
        spec = r.deployment(service)["spec"]["template"]["spec"]
        env = container_env(spec["containers"][0])
        mounted = any(v.get("secret", {}).get("secretName") == f"{RELEASE}-auth-policy" for v in spec["volumes"])
        # The services users reach read it; the agent only relays the principal.
        assert mounted == (service != "agent") and (("AGENTMESH_AUTH_POLICY" in env) == (service != "agent"))
    exposed = render({**POLICY_VALUES, "gateway": {"service": {"type": "LoadBalancer"}}})
    assert exposed.deployment("gateway")  # a policy is authentication enough to expose the gateway


def test_a_service_account_without_its_hash_is_refused():
    values = json.loads(json.dumps(POLICY_VALUES))
    values["auth"]["policy"]["serviceAccountHashes"] = {}
    with pytest.raises(Exception, match="nightly-ci has no token hash"):
        render(values)
