"""The Pod a session sandbox runs as in a cluster (AGENTMESH_SANDBOX_ISOLATION=session), and the
command each call execs in it.

The pod is hardened exactly as a call's Job pod (both built by `k8s_job.sandbox_pod_spec`, around
`hardened_pod_spec` and `container_security`: non-root, no service-account token, all capabilities dropped, seccomp
RuntimeDefault, read-only root, requests and limits). Its main process does nothing but wait and
reap orphans; the calls are started by the session supervisor the tools service runs in it
through one long-lived `pods/exec` stream (k8s_supervisor.py).

Its workspace: with a shared claim, `subPath: <session_id>` as a call's pod; a warm pod (made
before any session asked for it) mounts `subPath: @warm-pool/<pod name>` instead, an empty
directory no session id can name ('@' is not in the id alphabet), which the claim renames to
the session's workspace (k8s_pool.py). Without a claim, an emptyDir of the quota's size.

Each call runs under the workspace quota's wrapper (k8s_quota.py), started by the supervisor as
the leader of a new process group, with one change: the program stays in the wrapper's group
(no `setsid` of its own), so the supervisor's kill of the call (its timeout, its output past the
drain bound, a cancelled call, the stream's end) kills the wrapper, its watch and the program
together.
"""

from __future__ import annotations

import uuid
from typing import Any

from agentmesh.tools.sandbox.k8s_job import (
    COMPONENT_LABELS,
    LABEL_EGRESS,
    LABEL_SESSION,
    label_value,
    sandbox_pod_spec,
)
from agentmesh.tools.sandbox.k8s_quota import WRAPPER, kib
from agentmesh.tools.settings import MIB, KubernetesSandbox

__all__ = [
    "CALL_WRAPPER",
    "LABEL_POOL",
    "LABEL_SANDBOX_POD",
    "LABEL_TEMPLATE",
    "POOL_DIR",
    "SESSION_PODS",
    "build_session_pod",
    "call_command",
    "session_pod_name",
]

COMPONENT = "session-sandbox"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_SANDBOX_POD = "agentmesh.io/sandbox-pod"
LABEL_TEMPLATE = "agentmesh.io/template"
# "warm": in the pool, free; "claimed": a session's (set by the claim, with the session's label).
LABEL_POOL = "agentmesh.io/pool"
ANNOTATION_SESSION = "agentmesh.io/session-id"
# Where warm pods' workspaces wait on the shared claim: not a name any session id can take.
POOL_DIR = "@warm-pool"
SESSION_PODS = f"{LABEL_COMPONENT}={COMPONENT},app.kubernetes.io/managed-by={COMPONENT_LABELS['app.kubernetes.io/managed-by']}"

# PID 1 of the pod: waits, and (dash's wait reaps any child) reaps the orphans calls leave.
IDLE = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"

# The quota wrapper with the program in the wrapper's own process group (see above).
CALL_WRAPPER = WRAPPER.replace('if command -v setsid >/dev/null 2>&1; then setsid "$@" & else "$@" & fi', '"$@" &')


def session_pod_name(warm: bool = False) -> str:
    return f"agentmesh-{'warm' if warm else 'ses'}-{uuid.uuid4().hex[:16]}"


def call_command(argv: tuple[str, ...] | list[str], quota_bytes: int, file_size_bytes: int) -> list[str]:
    """What the supervisor starts for one call in the session's pod: `argv` under the quota wrapper."""
    return ["/bin/sh", "-c", CALL_WRAPPER, "agentmesh-call", str(kib(quota_bytes)), str(kib(file_size_bytes)), "--",
            *argv]


def build_session_pod(cfg: KubernetesSandbox, name: str, identity: tuple[int, int], *, template: str,
                      session_id: str = "", network: bool = False, quota_bytes: int = 1024 * MIB) -> dict[str, Any]:
    """A session's pod, or (no `session_id`) a warm pool pod of `template`."""
    labels = {
        **COMPONENT_LABELS,
        LABEL_COMPONENT: COMPONENT,
        LABEL_SANDBOX_POD: name,
        LABEL_TEMPLATE: label_value(template),
        LABEL_EGRESS: "allow" if network else "deny",
    }
    annotations = {}
    if session_id:
        labels[LABEL_SESSION] = label_value(session_id)
        annotations[ANNOTATION_SESSION] = session_id
    else:
        labels[LABEL_POOL] = "warm"
    spec = sandbox_pod_spec(cfg, identity, ["/bin/sh", "-c", IDLE], sub_path=session_id or f"{POOL_DIR}/{name}",
                            quota_bytes=quota_bytes)
    metadata: dict[str, Any] = {"name": name, "namespace": cfg.namespace, "labels": labels}
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
