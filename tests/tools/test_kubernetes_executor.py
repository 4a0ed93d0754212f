"""The Kubernetes executor's own cases: failures a cluster produces, the Job it sends, the calls it makes.

Runs against the fake API server (tests/tools/fake_kube.py); the cases a real cluster can
produce as well also run there with the `kubernetes` marker when KUBECONFIG is set.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.tools.backends import BACKENDS, CLAIM, NAMESPACE
from tests.tools.support import ToolsClient, wait_until

CLUSTERS = [
    pytest.param("fake-kubernetes", id="fake"),
    pytest.param(
        "kubernetes",
        id="real",
        marks=[pytest.mark.kubernetes, pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="KUBECONFIG is not set")],
    ),
]
GRANTED = {("create", "jobs"), ("get", "jobs"), ("list", "jobs"), ("watch", "jobs"), ("delete", "jobs"), ("get", "pods"), ("list", "pods"), ("watch", "pods"), ("get", "pods/log")}


@pytest.fixture(params=CLUSTERS)
def cluster(request, home):
    backend = BACKENDS[request.param](home)
    yield backend
    backend.close()


@pytest.fixture
def fake(home):
    backend = BACKENDS["fake-kubernetes"](home)
    yield backend
    backend.close()


async def no_leftovers(backend) -> None:
    assert await wait_until(lambda: not backend.leftovers("")), backend.leftovers("")


async def test_image_pull_failure_is_reported(cluster, home):
    env = {**cluster.env(), "AGENTMESH_SANDBOX_IMAGE": "registry.invalid/agentmesh/no-such-image:1", "AGENTMESH_SANDBOX_START_TIMEOUT_S": "60"}
    async with ToolsClient(home, env) as tools:
        result = await tools.call("shell", {"command": "echo never"})
    assert result.is_error and result.error_kind == "image_pull", result.output
    assert "registry.invalid/agentmesh/no-such-image:1" in result.output
    await no_leftovers(cluster)


async def test_unschedulable_pod_is_reported(cluster, home):
    env = {**cluster.env(), "AGENTMESH_SANDBOX_MEMORY_LIMIT": "100Ti", "AGENTMESH_SANDBOX_START_TIMEOUT_S": "2"}
    async with ToolsClient(home, env) as tools:
        result = await tools.call("shell", {"command": "echo never"})
    assert result.is_error and result.error_kind == "unschedulable", result.output
    assert "Insufficient memory" in result.output
    await no_leftovers(cluster)


async def test_job_deadline_exceeded_is_a_timeout(fake, home):
    fake.fake.deadline_override_s = 0.5
    async with ToolsClient(home, fake.env()) as tools:
        result = await tools.call("shell", {"command": "sleep 20", "timeout_s": 30})
    assert result.is_error and result.error_kind == "timeout", result.output
    assert "activeDeadlineSeconds" in result.output
    await no_leftovers(fake)


async def test_every_job_is_valid_hardened_and_labelled(fake, home):
    async with ToolsClient(home, fake.env()) as tools:
        await tools.call("shell", {"command": "true"}, session_id="team.alpha", call_id="call_7")
        await tools.call("python", {"code": "print(1)"}, session_id="-odd-session-", call_id="x" * 100)
    assert fake.fake.invalid == [] and len(fake.fake.posted) == 2
    job = fake.fake.posted[0]
    assert job["metadata"]["namespace"] == NAMESPACE
    assert job["metadata"]["labels"]["agentmesh.io/session"] == "team.alpha"
    assert job["metadata"]["labels"]["agentmesh.io/call-id"] == "call_7"
    spec = job["spec"]
    assert spec["backoffLimit"] == 0 and spec["activeDeadlineSeconds"] > 0 and spec["ttlSecondsAfterFinished"] > 0
    pod = spec["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False and pod["restartPolicy"] == "Never"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == (os.getuid() or 65534)
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    container = pod["containers"][0]
    hardening = container["securityContext"]
    assert hardening["readOnlyRootFilesystem"] is True and hardening["allowPrivilegeEscalation"] is False
    assert hardening["capabilities"] == {"drop": ["ALL"]}
    assert set(container["resources"]["limits"]) >= {"cpu", "memory"} and set(container["resources"]["requests"]) >= {"cpu", "memory"}
    assert {"name": "workspace", "mountPath": "/workspace", "subPath": "team.alpha"} in container["volumeMounts"]
    assert {"name": "workspace", "persistentVolumeClaim": {"claimName": CLAIM}} in pod["volumes"]
    assert not [e for e in container["env"] if e["name"].startswith("AGENTMESH")]
    # No Secret reaches a sandbox pod: not the service keys, not the model key.
    assert not [v for v in pod["volumes"] if {"secret", "projected"} & set(v)]
    assert not [e for e in container["env"] if "valueFrom" in e]
    # Ids that are not valid label values are hashed; the annotations keep them whole.
    odd = fake.fake.posted[1]["metadata"]
    assert odd["labels"]["agentmesh.io/session"].startswith("h-") and odd["annotations"]["agentmesh.io/session-id"] == "-odd-session-"
    assert len(odd["labels"]["agentmesh.io/call-id"]) <= 63


async def test_runtime_class_and_trace_context_reach_the_pod(fake, home):
    env = {**fake.env(), "AGENTMESH_SANDBOX_RUNTIME_CLASS": "gvisor", "AGENTMESH_TRACES": "local"}
    async with ToolsClient(home, env) as tools:
        result = await tools.call("shell", {"command": "echo $TRACEPARENT"})
    pod = fake.fake.posted[0]["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "gvisor"
    points = [json.loads(line) for path in (home / "metrics").glob("tools-*.jsonl") for line in path.read_text().splitlines()]
    waits = [p for p in points if p["name"] == "agentmesh.sandbox.wait"]
    assert waits and waits[-1]["attributes"] == {"executor": "kubernetes"} and waits[-1]["count"] == 1
    traceparent = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}["TRACEPARENT"]
    assert result.stdout.strip() == traceparent and traceparent.startswith("00-")
    assert fake.fake.invalid == []


async def test_only_granted_calls_are_made(fake, home):
    async with ToolsClient(home, fake.env()) as tools:
        await tools.call("shell", {"command": "echo ok"})
        await tools.call("shell", {"command": "exit 1"})
        await tools.call("shell", {"command": "sleep 10", "timeout_s": 0.5})
    assert fake.fake.forbidden == []
    assert set(fake.fake.requests) <= GRANTED
    assert {("create", "jobs"), ("delete", "jobs"), ("list", "pods"), ("watch", "pods"), ("get", "pods/log")} <= set(fake.fake.requests)
    await no_leftovers(fake)


async def test_api_hiccups_are_retried(fake, home):
    async with ToolsClient(home, fake.env()) as tools:
        fake.fake.fail_next = [503, 429]
        result = await tools.call("shell", {"command": "echo after-retries"})
    assert not result.is_error, result.output
    assert "after-retries" in result.stdout
    await no_leftovers(fake)


async def test_an_unreachable_api_server_is_a_clear_error(fake, home):
    env = {**fake.env(), "AGENTMESH_SANDBOX_API_RETRIES": "1"}
    fake.close()
    async with ToolsClient(home, env) as tools:
        result = await tools.call("shell", {"command": "true"})
    assert result.is_error and result.error_kind == "sandbox_unavailable", result.output
    assert "Kubernetes" in result.output


def test_sandbox_pods_run_as_the_services_uid_and_never_as_root():
    from agentmesh.tools.sandbox.k8s_job import pod_identity
    from agentmesh.tools.settings import KubernetesSandbox

    assert pod_identity(KubernetesSandbox(), 10001, 10001) == (10001, 10001)
    assert pod_identity(KubernetesSandbox(), 0, 0) == (65534, 65534)
    assert pod_identity(KubernetesSandbox(pod_uid=2000, pod_gid=3000), 10001, 10001) == (2000, 3000)


def _pod(state: dict | None = None, phase: str = "Running", conditions: list | None = None, reason: str = "") -> dict:
    status = {"phase": phase, "conditions": conditions or []}
    if reason:
        status["reason"] = reason
    if state is not None:
        status["containerStatuses"] = [{"name": "sandbox", "state": state}]
    return {"metadata": {"name": "job-abcde"}, "status": status}


def test_tracker_reads_cluster_states():
    from agentmesh.tools.sandbox.k8s_watch import JobTracker

    tracker = JobTracker("job", timeout_s=10, start_timeout_s=5, memory_limit="128Mi", created_at=0.0)
    # A first ErrImagePull may be a registry hiccup the kubelet retries: not final yet.
    assert tracker.on_pod(_pod({"waiting": {"reason": "ErrImagePull", "message": "timeout"}}, "Pending"), 1.0) is None
    assert tracker.on_pod(_pod({"waiting": {"reason": "ImagePullBackOff"}}, "Pending"), 2.0).error_kind == "image_pull"
    assert tracker.on_pod(_pod({"terminated": {"exitCode": 137, "reason": "OOMKilled"}}, "Failed"), 3.0).error_kind == "oom"
    assert tracker.on_pod(_pod({"terminated": {"exitCode": 3, "reason": "Error"}}, "Failed"), 3.0).exit_code == 3
    assert tracker.on_pod(_pod(None, "Failed", reason="DeadlineExceeded"), 3.0).error_kind == "timeout"
    assert tracker.on_job({"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]}}).error_kind == "timeout"
    assert tracker.on_job(None).error_kind == "sandbox_error"

    pending = JobTracker("job", timeout_s=10, start_timeout_s=5, memory_limit="128Mi", created_at=0.0)
    unschedulable = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes are available"}]
    assert pending.on_pod(_pod(None, "Pending", unschedulable), 1.0) is None
    assert pending.on_tick(4.9) is None
    verdict = pending.on_tick(5.0)
    assert verdict.error_kind == "unschedulable" and "0/3 nodes are available" in verdict.detail

    running = JobTracker("job", timeout_s=2, start_timeout_s=5, memory_limit="128Mi", created_at=0.0)
    running.on_pod(_pod({"running": {}}), 3.0)
    assert running.next_deadline() == 5.0 and running.on_tick(4.0) is None
    assert running.on_tick(5.0).error_kind == "timeout"


async def test_missing_cluster_credentials_stop_the_service_with_a_clear_message(home):
    from agentmesh.config import ConfigError

    with pytest.raises(ConfigError) as err:
        async with ToolsClient(home, {"AGENTMESH_SANDBOX": "kubernetes", "KUBECONFIG": str(home / "missing-kubeconfig")}):
            pass
    assert "KUBECONFIG" in str(err.value) and "service account" in str(err.value)
