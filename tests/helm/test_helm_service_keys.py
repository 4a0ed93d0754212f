"""The chart's service keys: each pod holds its own private key and the others' certificates,
the keys the chart makes are ones the services accept, and no sandbox pod sees any of them."""

from __future__ import annotations

import base64
import json

from agentmesh.rpc.identity import ServiceIdentity
from tests.helm.helm_support import RELEASE, SERVICES, container_env, render

KEYS_DIR = "/var/run/agentmesh/keys"


def projected_files(deployment: dict) -> dict[str, tuple[str, str]]:
    """path in the keys volume -> (Secret name, key in it)."""
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    files = {}
    for source in volumes["service-keys"]["projected"]["sources"]:
        for item in source["secret"]["items"]:
            files[item["path"]] = (source["secret"]["name"], item["key"])
    return files


def test_each_service_holds_only_its_own_private_key():
    r = render()
    for service in SERVICES:
        deployment = r.deployment(service)
        files = projected_files(deployment)
        assert {p for p in files if p.endswith(".key")} == {f"{service}.key"}
        assert files[f"{service}.key"] == (f"{RELEASE}-{service}-key", "tls.key")
        assert {p for p in files if p.endswith(".crt")} == {f"{s}.crt" for s in SERVICES}
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        mount = next(m for m in container["volumeMounts"] if m["name"] == "service-keys")
        assert mount == {"name": "service-keys", "mountPath": KEYS_DIR, "readOnly": True}
        assert container_env(container)["AGENTMESH_SERVICE_KEYS_DIR"] == KEYS_DIR


def test_the_keys_the_chart_makes_sign_tokens_the_services_accept(tmp_path):
    r = render()
    secrets = {s["metadata"]["name"]: s for s in r.kind("Secret")}
    pods = {}
    for service in ("agent", "tools"):
        keys = tmp_path / service
        keys.mkdir()
        for path, (secret, key) in projected_files(r.deployment(service)).items():
            (keys / path).write_bytes(base64.b64decode(secrets[secret]["data"][key]))
        keys.chmod(0o500)  # read-only, as the mount is: nothing may be created there
        pods[service] = ServiceIdentity.open(service, keys)
    assert pods["tools"].verify(pods["agent"].sign("tools")).via == "agent"
    assert secrets[f"{RELEASE}-agent-key"]["type"] == "kubernetes.io/tls"


def test_cert_manager_can_make_the_keys_instead():
    r = render({"serviceKeys": {"provider": "certManager"}})
    assert [s for s in r.kind("Secret") if s["type"] == "kubernetes.io/tls"] == []
    certificates = {c["metadata"]["name"]: c["spec"] for c in r.kind("Certificate")}
    assert set(certificates) == {f"{RELEASE}-{s}-key" for s in SERVICES}
    spec = certificates[f"{RELEASE}-agent-key"]
    assert spec["secretName"] == f"{RELEASE}-agent-key" and spec["privateKey"]["algorithm"] == "Ed25519"
    assert spec["issuerRef"] == {"name": f"{RELEASE}-service-keys", "kind": "Issuer"}
    assert r.get("Issuer", f"{RELEASE}-service-keys")["spec"] == {"selfSigned": {}}


def test_existing_secrets_are_only_referenced():
    r = render({"serviceKeys": {"provider": "existing"}})
    assert r.kind("Secret") == [] and r.kind("Certificate") == []
    assert projected_files(r.deployment("memory"))["memory.key"] == (f"{RELEASE}-memory-key", "tls.key")


def test_no_sandbox_pod_or_other_workload_mounts_a_service_key():
    r = render()
    for workload in r.workloads():
        name = workload["metadata"]["name"]
        text = json.dumps(workload["spec"])
        if name.removeprefix(f"{RELEASE}-") in SERVICES:
            continue
        assert "-key" not in text and "service-keys" not in text, name
    # The sandbox pod is built by the tools service, not the chart: its spec has no Secret volume.
    config = r.config()
    assert not any("KEY" in k for k in config), config
