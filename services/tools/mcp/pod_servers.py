"""The tools service's MCP server pods as a whole: making one per server entry, removing what an
earlier run left behind, and telling a server that cannot run at all apart from one that is down.

Leftovers: a tools service deletes its pods when their connections end and when it shuts down.
One that crashed cannot; its servers then see end of input (`stdinOnce`) and exit, so their pods
end up terminated. At start each tools service deletes every terminated MCP server pod, and every
pod labelled with its own owner name (the host name: a tools container restarted in the same pod,
or the same machine) — never a running pod of another replica.
"""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path
from typing import TextIO

import urllib3

from agentmesh.logs import get_logger
from agentmesh.tools.mcp.config import McpServerEntry
from agentmesh.tools.mcp.connection import McpServerConnection, SupervisorTimings
from agentmesh.tools.mcp.pod_opener import PodServer
from agentmesh.tools.mcp.pod_spec import LABEL_MCP_OWNER, SERVER_PODS
from agentmesh.tools.sandbox.k8s_api import KubeApiError, KubernetesJobs
from agentmesh.tools.sandbox.k8s_job import label_value
from agentmesh.tools.settings import KubernetesSandbox

log = get_logger("agentmesh.tools.mcp")


def owner_name(root: Path) -> str:
    """This service's name on its pods: stable across its restarts (the host name; in a cluster the
    tools pod's, kept when its container restarts) and apart from another service on the same
    machine (its data directory)."""
    data = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:8]
    return label_value(f"{socket.gethostname()}.{data}")


class PodServers:
    def __init__(self, api: KubernetesJobs, cfg: KubernetesSandbox, identity: tuple[int, int], timings: SupervisorTimings,
                 owner: str):
        self._api = api
        self._cfg = cfg
        self._identity = identity
        self.owner = owner
        # Starting a pod (scheduling, pulling the image) is part of connecting to its server.
        self.timings = SupervisorTimings(
            connect_timeout_s=timings.connect_timeout_s + cfg.start_timeout_s, idle_s=timings.idle_s,
            ping_interval_s=timings.ping_interval_s, backoff_initial_s=timings.backoff_initial_s,
            backoff_max_s=timings.backoff_max_s)
        self._deployment: list[PodServer] = []

    def connection(self, entry: McpServerEntry, errlog: TextIO, namespace: str = "") -> McpServerConnection:
        server = PodServer(entry, self._api, self._cfg, self._identity, self.owner, namespace, errlog)
        if not namespace:
            self._deployment.append(server)
        return McpServerConnection(entry.name, server.opener, self.timings)

    def configuration_problems(self) -> list[str]:
        """Why deployment servers could not run at all (image, command, permissions), after their first start."""
        return [str(server.failure) for server in self._deployment if server.failure and server.failure.configuration]

    async def sweep(self) -> int:
        """Delete the MCP server pods an earlier run left behind; how many."""
        try:
            pods, _ = await self._api.list_pods(SERVER_PODS)
        except (KubeApiError, urllib3.exceptions.HTTPError, OSError) as exc:
            log.warning("could not look for leftover MCP server pods", error=str(exc))
            return 0
        removed = 0
        for pod in pods:
            metadata = pod.get("metadata") or {}
            ended = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
            ours = (metadata.get("labels") or {}).get(LABEL_MCP_OWNER) == self.owner
            if (ended or ours) and not metadata.get("deletionTimestamp"):
                try:
                    removed += await self._api.delete_pod(metadata["name"])
                except (KubeApiError, urllib3.exceptions.HTTPError, OSError) as exc:
                    log.warning("could not delete a leftover MCP server pod", pod=metadata.get("name"), error=str(exc))
        if removed:
            log.info("removed leftover MCP server pods", count=removed)
        return removed
