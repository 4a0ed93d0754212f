"""The batch/v1 Job one sandboxed call runs as: a hardened pod, built as a plain dict.

Hardening (docs/architecture.md, "Security baseline"): a non-root uid (the tools service's own, so both
can write the shared workspace; 65534 if that is root), read-only root file system, all
capabilities dropped, no privilege escalation, seccomp RuntimeDefault, no service account token,
no service links in the environment, requests and limits, activeDeadlineSeconds, backoffLimit 0,
and a TTL so the API server removes it even if our own delete never happens.

Workspace: one ReadWriteMany PersistentVolumeClaim shared by all sessions, mounted with
`subPath: <session_id>`, so a pod sees its own session's directory and nothing above it. The
tools service mounts the same claim at $AGENTMESH_HOME/workspaces for its file tools. The
command runs under the workspace quota's wrapper (`k8s_quota.py`); without a claim the workspace
is an emptyDir whose sizeLimit is the quota.
"""

from __future__ import annotations

import hashlib
import math
import re
import uuid
from collections.abc import Sequence
from typing import Any

from agentmesh.tools.sandbox.base import CommandSpec
from agentmesh.tools.sandbox.k8s_quota import quota_command
from agentmesh.tools.settings import MIB, KubernetesSandbox, SandboxLimits, ToolsSettings

NOBODY = 65534
CONTAINER = "sandbox"
LABEL_SESSION = "agentmesh.io/session"
LABEL_CALL = "agentmesh.io/call-id"
LABEL_JOB = "agentmesh.io/job"
LABEL_EGRESS = "agentmesh.io/egress"
COMPONENT_LABELS = {"app.kubernetes.io/name": "agentmesh-sandbox", "app.kubernetes.io/managed-by": "agentmesh-tools"}
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")


def label_value(value: str) -> str:
    """`value` if Kubernetes accepts it as a label value, else a stable hash of it."""
    if _LABEL_VALUE.match(value):
        return value
    return "h-" + hashlib.sha256(value.encode()).hexdigest()[:20]


def job_name() -> str:
    """Unique per call, a valid DNS-1123 label (the Job controller puts it in a pod label too)."""
    return f"agentmesh-sbx-{uuid.uuid4().hex[:16]}"


def pod_identity(cfg: KubernetesSandbox, service_uid: int, service_gid: int) -> tuple[int, int]:
    """The (uid, gid) sandbox pods run as: configured, else the service's own, never root."""
    uid = cfg.pod_uid or (service_uid if service_uid != 0 else NOBODY)
    gid = cfg.pod_gid or (service_gid if service_gid != 0 else NOBODY)
    return uid, gid


def build_job(
    spec: CommandSpec,
    cfg: KubernetesSandbox,
    name: str,
    traceparent: str = "",
    identity: tuple[int, int] = (NOBODY, NOBODY),
    *,
    quota_bytes: int = ToolsSettings.workspace_quota_bytes,
    file_size_bytes: int = SandboxLimits.file_size_bytes,
) -> dict[str, Any]:
    labels = {
        **COMPONENT_LABELS,
        LABEL_SESSION: label_value(spec.session_id),
        LABEL_CALL: label_value(spec.call_id or name),
    }
    pod_labels = {**labels, LABEL_JOB: name, LABEL_EGRESS: "allow" if spec.network else "deny"}
    env = [{"name": "TRACEPARENT", "value": traceparent}] if traceparent else []
    pod_spec = sandbox_pod_spec(cfg, identity, quota_command(spec.argv, quota_bytes, file_size_bytes),
                                sub_path=spec.session_id, quota_bytes=quota_bytes, extra_env=env)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": cfg.namespace,
            "labels": labels,
            "annotations": {"agentmesh.io/session-id": spec.session_id, "agentmesh.io/call-id": spec.call_id},
        },
        "spec": {
            "backoffLimit": 0,
            # A backstop for the whole Job (scheduling and image pull included); the executor
            # enforces the call's own timeout from the moment the container starts.
            "activeDeadlineSeconds": int(math.ceil(spec.timeout_s + cfg.start_timeout_s)),
            "ttlSecondsAfterFinished": cfg.ttl_after_finished_s,
            "template": {"metadata": {"labels": pod_labels}, "spec": pod_spec},
        },
    }


def sandbox_pod_spec(cfg: KubernetesSandbox, identity: tuple[int, int], command: list[str], *, sub_path: str,
                     quota_bytes: int, extra_env: Sequence[dict[str, str]] = ()) -> dict[str, Any]:
    """The pod spec of a sandbox pod (a call's Job or a session's pod) running `command` in the
    workspace: the shared claim at `sub_path`, or without one an emptyDir of the quota's size."""
    uid, gid = identity
    if cfg.workspace_pvc:
        workspace_volume = {"name": "workspace", "persistentVolumeClaim": {"claimName": cfg.workspace_pvc}}
        workspace_mount = {"name": "workspace", "mountPath": "/workspace", "subPath": sub_path}
    else:
        # Without a shared claim files live only as long as the pod (documented in docs/tools.md).
        workspace_volume = {"name": "workspace", "emptyDir": {"sizeLimit": f"{max(quota_bytes // MIB, 1)}Mi"}}
        workspace_mount = {"name": "workspace", "mountPath": "/workspace"}
    container = {
        "name": CONTAINER,
        "image": cfg.image,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "workingDir": "/workspace",
        "env": [
            {"name": "HOME", "value": "/workspace"},
            {"name": "LANG", "value": "C.UTF-8"},
            {"name": "TMPDIR", "value": "/tmp"},
            *extra_env,
        ],
        "resources": {
            "requests": {"cpu": cfg.cpu_request, "memory": cfg.memory_limit, "ephemeral-storage": "64Mi"},
            "limits": {"cpu": cfg.cpu_limit, "memory": cfg.memory_limit, "ephemeral-storage": cfg.tmp_size},
        },
        "securityContext": container_security(uid, gid),
        "volumeMounts": [workspace_mount, {"name": "tmp", "mountPath": "/tmp"}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    return hardened_pod_spec(cfg, uid, gid, container,
                             [workspace_volume, {"name": "tmp", "emptyDir": {"sizeLimit": cfg.tmp_size}}])


def container_security(uid: int, gid: int) -> dict[str, Any]:
    """The container's confinement, the same for every pod the tools service starts."""
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": gid,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def hardened_pod_spec(cfg: KubernetesSandbox, uid: int, gid: int, container: dict[str, Any],
                      volumes: list[dict[str, Any]]) -> dict[str, Any]:
    """A pod spec around `container` with no token, no host namespaces and no service links —
    for a call's Job and an MCP server's pod alike, so hardening one hardens both."""
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "terminationGracePeriodSeconds": 0,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": uid,
            "runAsGroup": gid,
            "fsGroup": gid,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
    }
    if cfg.runtime_class:
        spec["runtimeClassName"] = cfg.runtime_class
    return spec
