"""The Pod a stdio MCP server runs as with AGENTMESH_SANDBOX=kubernetes: one long-lived pod per
server and namespace (per tools replica), hardened like the sandbox Job pods.

The container's main process is the server itself, its stdin held open for the tools service to
attach to (`stdin: true`); `stdinOnce: true` makes the runtime close that stdin when the attach
ends, so a tools service that dies takes its servers with it: an MCP stdio server exits on end of
input, and its pod ends (`restartPolicy: Never` — restarting is the supervisor's business, with
backoff, in a fresh pod). The pod is deleted when the connection ends (idle, restart, shutdown);
what is left behind by a replica that crashed is found by its labels (`LABEL_MCP_OWNER`) and
removed by the next tools service that starts.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from agentmesh.tools.mcp.config import McpServerEntry
from agentmesh.tools.sandbox.k8s_job import (
    COMPONENT_LABELS,
    LABEL_EGRESS,
    container_security,
    hardened_pod_spec,
    label_value,
)
from agentmesh.tools.settings import KubernetesSandbox

CONTAINER = "server"
COMPONENT = "mcp-server"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MCP_SERVER = "agentmesh.io/mcp-server"
LABEL_MCP_NAMESPACE = "agentmesh.io/mcp-namespace"
LABEL_MCP_OWNER = "agentmesh.io/mcp-owner"
LABEL_MCP_POD = "agentmesh.io/mcp-pod"
# Every MCP server pod any tools service made: the selector leftovers are looked for with.
SERVER_PODS = f"{LABEL_COMPONENT}={COMPONENT},app.kubernetes.io/managed-by={COMPONENT_LABELS['app.kubernetes.io/managed-by']}"
_NOT_DNS = re.compile(r"[^a-z0-9-]")


def pod_name(server: str) -> str:
    """Unique per start of a server, a DNS-1123 name that says which server it is."""
    return f"agentmesh-mcp-{_NOT_DNS.sub('-', server.lower())}-{uuid.uuid4().hex[:10]}"


def build_server_pod(entry: McpServerEntry, cfg: KubernetesSandbox, name: str, identity: tuple[int, int], owner: str,
                     namespace: str = "") -> dict[str, Any]:
    uid, gid = identity
    labels = {
        **COMPONENT_LABELS,
        LABEL_COMPONENT: COMPONENT,
        LABEL_MCP_SERVER: label_value(entry.name),
        LABEL_MCP_OWNER: label_value(owner),
        LABEL_MCP_POD: name,
        # The sandbox NetworkPolicies: no ingress, egress only with "network": true.
        LABEL_EGRESS: "allow" if entry.network else "deny",
    }
    if namespace:
        labels[LABEL_MCP_NAMESPACE] = label_value(namespace)
    # No TRACEPARENT: one long-lived process serves many traces; each call's _meta carries its own.
    env = [
        {"name": "HOME", "value": "/workspace"},
        {"name": "LANG", "value": "C.UTF-8"},
        {"name": "TMPDIR", "value": "/tmp"},
        *({"name": key, "value": value} for key, value in entry.env.items()),
    ]
    container = {
        "name": CONTAINER,
        "image": entry.image or cfg.image,
        "imagePullPolicy": "IfNotPresent",
        "command": [entry.command, *entry.args],
        "workingDir": "/workspace",
        "env": env,
        "stdin": True,
        "stdinOnce": True,
        "tty": False,
        "resources": {
            # Memory requested and limited alike, as for the sandbox's Jobs: OOM-killed at it, never evicted.
            "requests": {"cpu": cfg.cpu_request, "memory": cfg.mcp_memory_limit, "ephemeral-storage": "64Mi"},
            "limits": {"cpu": cfg.mcp_cpu_limit, "memory": cfg.mcp_memory_limit, "ephemeral-storage": cfg.tmp_size},
        },
        "securityContext": container_security(uid, gid),
        "volumeMounts": [{"name": "workspace", "mountPath": "/workspace"}, {"name": "tmp", "mountPath": "/tmp"}],
        # A server that fails to start says why on stderr: the pod's status then quotes it.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    # A server's files live as long as its pod: no session's workspace is mounted.
    pod_spec = hardened_pod_spec(cfg, uid, gid, container,
                                 [{"name": "workspace", "emptyDir": {"sizeLimit": cfg.tmp_size}},
                                  {"name": "tmp", "emptyDir": {"sizeLimit": cfg.tmp_size}}])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": cfg.namespace,
            "labels": labels,
            "annotations": {"agentmesh.io/mcp-server": entry.name, "agentmesh.io/mcp-namespace": namespace,
                            "agentmesh.io/mcp-owner": owner},
        },
        "spec": pod_spec,
    }
