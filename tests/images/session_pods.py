"""The cluster executors in this process against the podman-backed Kubernetes API (podman_kube.py):
for the session-pod image tests and benches/images.py.

The executors are the tools service's own (KubernetesExecutor: a Job per call;
KubernetesSessionPods: a pod per session, calls through pods/exec, optionally a warm pool);
only the process they run in differs from the stack's services container, so many executors (two
"replicas") can share one API and one workspace claim.
"""

from __future__ import annotations

from pathlib import Path

from opentelemetry import trace

from agentmesh.tools.quota import WorkspaceQuota
from agentmesh.tools.sandbox.k8s_api import KubernetesJobs
from agentmesh.tools.sandbox.k8s_pool import PoolSizing, WarmPool
from agentmesh.tools.sandbox.k8s_session import KubernetesSessionPods
from agentmesh.tools.sandbox.kubernetes import KubernetesExecutor, api_client_for
from agentmesh.tools.settings import MIB, KubernetesSandbox, SandboxLimits
from agentmesh.tools.workspace import Workspaces
from tests.images.podman import SERVICE_UID
from tests.images.podman_kube import PodmanKube

__all__ = ["CLAIM", "NAMESPACE", "Cluster"]

CLAIM = "agentmesh-workspaces"
NAMESPACE = "agentmesh-sandbox"
IDENTITY = (SERVICE_UID, SERVICE_UID)


class Cluster:
    """A PodmanKube with a workspace claim at `scratch/workspaces` and executors on it."""

    def __init__(self, kube: PodmanKube, image: str, scratch: Path, memory_limit: str = "128Mi"):
        self.kube = kube
        self.workspaces = scratch / "workspaces"
        kubeconfig = kube.kubeconfig(scratch)
        self.cfg = KubernetesSandbox(namespace=NAMESPACE, image=image, workspace_pvc=CLAIM, memory_limit=memory_limit,
                                     start_timeout_s=90, kubeconfig=str(kubeconfig), pod_uid=SERVICE_UID,
                                     pod_gid=SERVICE_UID)
        self.quota = WorkspaceQuota(64 * MIB, 10_000)
        self.tracer = trace.get_tracer("tests.images")

    def api(self) -> KubernetesJobs:
        return KubernetesJobs(api_client_for(self.cfg), NAMESPACE)

    def jobs(self) -> KubernetesExecutor:
        return KubernetesExecutor(self.api(), self.cfg, SandboxLimits(), Workspaces(self.workspaces, IDENTITY), self.tracer,
                                  quota=self.quota)

    def sessions(self, *, idle_s: float = 600, pool: tuple[int, int] | None = None, owner: str = "tools-0") -> KubernetesSessionPods:
        api = self.api()
        warm = None
        if pool is not None:
            warm = WarmPool(api, self.cfg, IDENTITY, owner=owner, workspace_root=self.workspaces,
                            quota_bytes=self.quota.limit_bytes, sizing=PoolSizing(pool[0], pool[1], 300, 900),
                            interval_s=0.5)
        return KubernetesSessionPods(api, self.cfg, SandboxLimits(), Workspaces(self.workspaces, IDENTITY), self.tracer, IDENTITY,
                                     quota=self.quota, idle_s=idle_s, pool=warm)
