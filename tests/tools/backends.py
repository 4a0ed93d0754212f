"""The executors the shared behaviour suite runs against: the local jail, the Kubernetes executor on
the fake API server, and (marker `kubernetes`, KUBECONFIG set) a real cluster."""

from __future__ import annotations

import os
from pathlib import Path

from tests.tools.fake_kube import FakeKube
from tests.tools.support import describe, processes_with

NAMESPACE = "agentmesh-sandbox"
CLAIM = "agentmesh-workspaces"


class LocalBackend:
    name = "local"
    shares_files_with_service = True

    def __init__(self, home: Path):
        self.home = home

    def env(self) -> dict[str, str]:
        return {"AGENTMESH_SANDBOX_MEMORY_BYTES": str(256 * 1024 * 1024)}

    def leftovers(self, marker: str) -> list[str]:
        pids = processes_with(marker)
        return describe(pids).splitlines() if pids else []

    def close(self) -> None:
        pass


class LocalSessionBackend(LocalBackend):
    """The local jail with AGENTMESH_SANDBOX_ISOLATION=session: one jail per session, each call a
    process in it, `python` a cell of the session's interpreter."""

    name = "local-session"

    def env(self) -> dict[str, str]:
        return {**super().env(), "AGENTMESH_SANDBOX_ISOLATION": "session"}


class FakeKubernetesBackend:
    name = "fake-kubernetes"
    shares_files_with_service = True

    def __init__(self, home: Path):
        self.home = home
        # The claim is the tools service's own workspace root, as when both mount one RWX volume.
        self.fake = FakeKube(volumes={CLAIM: home / "workspaces"}).__enter__()

    def env(self) -> dict[str, str]:
        self.home.mkdir(parents=True, exist_ok=True)
        return {
            "AGENTMESH_SANDBOX": "kubernetes",
            "KUBECONFIG": str(self.fake.kubeconfig(self.home.parent)),
            "AGENTMESH_SANDBOX_NAMESPACE": NAMESPACE,
            "AGENTMESH_SANDBOX_WORKSPACE_PVC": CLAIM,
            "AGENTMESH_SANDBOX_IMAGE": "python:3.12-slim",
            "AGENTMESH_SANDBOX_MEMORY_LIMIT": "128Mi",
            "AGENTMESH_SANDBOX_START_TIMEOUT_S": "3",
        }

    def leftovers(self, marker: str) -> list[str]:
        jobs, pods = self.fake.live_objects()
        running = self.fake.running_processes()
        return [f"job {j}" for j in jobs] + [f"pod {p}" for p in pods] + ([f"{running} running containers"] if running else [])

    def close(self) -> None:
        self.fake.__exit__(None, None, None)


class FakeKubernetesSessionBackend(FakeKubernetesBackend):
    """The fake API server with AGENTMESH_SANDBOX_ISOLATION=session: one pod per session, each call
    a process exec'd into it. The session's pod lives on between calls: what is left over is a
    Job, or a process of a call (found by the call's marker)."""

    name = "fake-kubernetes-session"

    def env(self) -> dict[str, str]:
        return {**super().env(), "AGENTMESH_SANDBOX_ISOLATION": "session"}

    def leftovers(self, marker: str) -> list[str]:
        jobs, pods = self.fake.live_objects()
        if not marker:
            return [f"job {j}" for j in jobs] + [f"pod {p}" for p in pods]
        pids = processes_with(marker)
        return [f"job {j}" for j in jobs] + (describe(pids).splitlines() if pids else [])


class RealKubernetesBackend:
    """A real cluster from KUBECONFIG; AGENTMESH_SANDBOX_* from the test environment configure it."""

    name = "kubernetes"

    def __init__(self, home: Path):
        self.home = home
        self.namespace = os.environ.get("AGENTMESH_SANDBOX_NAMESPACE", NAMESPACE)
        # The service here cannot mount the cluster's volume, so files are shared only between pods.
        self.shares_files_with_service = False

    def env(self) -> dict[str, str]:
        keys = ("KUBECONFIG", "AGENTMESH_SANDBOX_NAMESPACE", "AGENTMESH_SANDBOX_IMAGE", "AGENTMESH_SANDBOX_WORKSPACE_PVC", "AGENTMESH_SANDBOX_RUNTIME_CLASS")
        env = {k: os.environ[k] for k in keys if os.environ.get(k)}
        env.update({"AGENTMESH_SANDBOX": "kubernetes", "AGENTMESH_SANDBOX_MEMORY_LIMIT": "128Mi", "AGENTMESH_SANDBOX_START_TIMEOUT_S": "120"})
        return env

    def leftovers(self, marker: str) -> list[str]:
        from kubernetes import client, config

        api = config.new_client_from_config(config_file=os.environ["KUBECONFIG"])
        try:
            jobs = client.BatchV1Api(api).list_namespaced_job(self.namespace, label_selector="app.kubernetes.io/managed-by=agentmesh-tools")
            return [f"job {j.metadata.name}" for j in jobs.items if not j.metadata.deletion_timestamp]
        finally:
            api.close()

    def close(self) -> None:
        pass


BACKENDS = {"local": LocalBackend, "local-session": LocalSessionBackend, "fake-kubernetes": FakeKubernetesBackend,
            "fake-kubernetes-session": FakeKubernetesSessionBackend, "kubernetes": RealKubernetesBackend}
