"""Every object the tools service sends to Kubernetes validates against the Kubernetes OpenAPI
schema (kubernetes-validate, strict: an unknown field is an error), for the oldest API the chart
supports and the newest the library knows.

The builders are the service's own: a call's Job, a session's pod and a warm pool pod (with and
without the shared workspace claim), a stdio MCP server's pod, and a warm pod as the claim's
merge patch leaves it. The tests' API server validates what actually arrives, too (fake_kube.py).
"""

from __future__ import annotations

import kubernetes_validate
import pytest

from agentmesh.tools.mcp.config import McpServerEntry
from agentmesh.tools.mcp.pod_spec import build_server_pod
from agentmesh.tools.sandbox.base import CommandSpec
from agentmesh.tools.sandbox.k8s_job import build_job, job_name
from agentmesh.tools.sandbox.k8s_session_pod import build_session_pod, session_pod_name
from agentmesh.tools.settings import KubernetesSandbox
from tests.tools.fake_kube_patch import merge_patch

VERSIONS = ["1.30", kubernetes_validate.latest_version()]
CONFIGS = {
    "claim": KubernetesSandbox(workspace_pvc="agentmesh-workspaces", runtime_class="gvisor"),
    "no-claim": KubernetesSandbox(),
}
IDENTITY = (10001, 10001)


def manifests(cfg: KubernetesSandbox) -> dict[str, dict]:
    spec = CommandSpec(session_id="team.a", call_id="call_1", argv=("/bin/sh", "-c", "echo hi"), timeout_s=30, network=True)
    warm = build_session_pod(cfg, session_pod_name(warm=True), IDENTITY, template="default")
    warm["metadata"]["resourceVersion"] = "7"
    claimed = merge_patch(warm, {"metadata": {"resourceVersion": "7", "labels": {"agentmesh.io/pool": "claimed", "agentmesh.io/session": "team.a"},
                                              "annotations": {"agentmesh.io/session-id": "team.a"}}})
    return {
        "job": build_job(spec, cfg, job_name(), "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", IDENTITY),
        "session pod": build_session_pod(cfg, session_pod_name(), IDENTITY, template="default", session_id="-odd id-", network=True),
        "warm pod": build_session_pod(cfg, session_pod_name(warm=True), IDENTITY, template="data"),
        "claimed warm pod": claimed,
        "mcp server pod": build_server_pod(McpServerEntry(name="time", command="/usr/bin/python3", args=("-m", "time_server"),
                                                          env={"TZ": "UTC"}), cfg, "agentmesh-mcp-time-1", IDENTITY, "tools-0", "team"),
    }


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_every_object_the_tools_service_sends_is_valid(version, config):
    for what, body in manifests(CONFIGS[config]).items():
        try:
            kubernetes_validate.validate(body, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{what} ({config}) is not a valid {body['kind']} for Kubernetes {version}: {exc}")
