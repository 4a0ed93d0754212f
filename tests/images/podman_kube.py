"""The test Kubernetes API (tests/tools/fake_kube.py) with a real container runtime as its kubelet.

The API server, Job controller and deadline handling are FakeKube's; what changes is the
kubelet: each pod (the Job controller's from the executor's Job template, or one created bare) is run by
`podman kube play` (runc, cgroupfs), from the image the template names, with the template's
securityContext, resources and volumes, and with no network. Its status is read back from
podman: Running once the container started, then `terminated` with the container's exit code
and `OOMKilled` when the kernel's memory-cgroup OOM killer ended it; its log is `podman logs`;
pods/exec is `podman exec` in its container.

Three things a kubelet does that podman 4.3 does not, done here the kubelet's way:
- `subPath` is ignored by `podman kube play`, so each PersistentVolumeClaim mount is resolved
  to the host directory the kubelet would bind (the claim's directory / subPath) before play;
- an emptyDir is played as a named volume shared by every pod of that volume name, so each is
  resolved to a directory of the pod's own;
- podman 4.3 under cgroups v1 does not notice a memory-cgroup OOM kill (State.OOMKilled stays
  false), so the kernel log is read for the kill of that container's cgroup, as the kubelet's
  own OOM watcher reads /dev/kmsg.
"""

from __future__ import annotations

import copy
import json
import subprocess
import threading
from pathlib import Path
from typing import Any

from agentmesh.tools.sandbox.k8s_job import CONTAINER
from tests.images.podman import Podman, PodmanError, podman_cwd, podman_env
from tests.tools.fake_kube import FakeKube
from tests.tools.fake_kubelet import container_status, now_rfc3339


def kubelet_pod(pod: dict[str, Any], claims: dict[str, Path], scratch: Path | None = None) -> dict[str, Any]:
    """The pod as `podman kube play` gets it: the pod's own spec, claim mounts resolved to host paths,
    and (with `scratch`) each emptyDir a directory of the pod's own under it."""
    spec = copy.deepcopy(pod["spec"])
    volumes = {v["name"]: v for v in spec["volumes"]}
    resolved = [v for v in spec["volumes"] if "persistentVolumeClaim" not in v and not (scratch and "emptyDir" in v)]
    for volume in spec["volumes"]:
        if scratch and "emptyDir" in volume:
            # podman 4.3 plays an emptyDir as the named volume of the same name, one for every pod
            # on the machine; a kubelet gives each pod its own, empty, world-writable directory.
            directory = scratch / "empty-dirs" / pod["metadata"]["name"] / volume["name"]
            directory.mkdir(parents=True)
            directory.chmod(0o777)
            resolved.append({"name": volume["name"], "hostPath": {"path": str(directory), "type": "Directory"}})
    for container in spec["containers"]:
        for index, mount in enumerate(container.get("volumeMounts", [])):
            volume = volumes[mount["name"]]
            if "persistentVolumeClaim" not in volume:
                continue
            directory = Path(claims[volume["persistentVolumeClaim"]["claimName"]]) / mount.get("subPath", "")
            directory.mkdir(parents=True, exist_ok=True)  # the kubelet creates a missing subPath
            name = f"{mount['name']}-{index}"
            resolved.append({"name": name, "hostPath": {"path": str(directory), "type": "Directory"}})
            container["volumeMounts"][index] = {k: v for k, v in mount.items() if k != "subPath"} | {"name": name}
    spec["volumes"] = resolved
    metadata = {"name": pod["metadata"]["name"], "labels": pod["metadata"].get("labels", {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def kernel_oom_killed(container_id: str) -> bool:
    """Whether the kernel's memory-cgroup OOM killer killed a process of this container."""
    result = subprocess.run(["dmesg"], capture_output=True, text=True)
    return any("oom-kill:" in line and f"libpod-{container_id}" in line for line in result.stdout.splitlines())


class PodmanKube(FakeKube):
    def __init__(self, podman: Podman, volumes: dict[str, Path], **kwargs: Any):
        super().__init__(volumes=volumes, **kwargs)
        self.podman = podman
        self.played: list[dict[str, Any]] = []  # what podman was given, for the tests to look at
        self.terminated: dict[str, dict[str, Any]] = {}  # pod name -> the container's final state

    def _run_pod(self, namespace: str, job: dict, key: tuple[str, str]) -> None:
        with self.cond:
            if key not in self.pods:
                return
            pod = copy.deepcopy(self.pods[key])
        self._update(key, lambda s: s["conditions"].append({"type": "PodScheduled", "status": "True"}))
        name = pod["metadata"]["name"]
        container = f"{name}-{CONTAINER}"
        image = pod["spec"]["containers"][0]["image"]
        manifest = kubelet_pod(pod, self.volumes, Path(self._scratch.name))
        path = Path(self._scratch.name) / f"{name}.json"
        path.write_text(json.dumps(manifest))
        with self.cond:
            self.played.append(manifest)
            self.podman.pods.append(name)
        played = self.podman.run("kube", "play", "--network", "none", "--quiet", str(path), check=False, timeout=120)
        if played.returncode != 0:
            message = played.stderr.decode(errors="replace").strip()[-500:]
            self._update(key, lambda s: s.update(containerStatuses=[container_status(image, {"waiting": {"reason": "CreateContainerError", "message": message}})]))
            return
        started = self.podman.inspect(container)["State"].get("StartedAt") or now_rfc3339()
        waiter = subprocess.Popen(["podman", "wait", container], env=podman_env(), cwd=podman_cwd(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        with self.cond:
            if key not in self.pods:
                waiter.kill()
                return
            self.procs[key] = waiter
        self._update(key, lambda s: s.update(phase="Running", containerStatuses=[container_status(image, {"running": {"startedAt": started}}, ready=True)]))
        waiter.wait()
        with self.cond:
            if self.procs.pop(key, None) is None:
                return  # deleted (Job deleted or past its deadline): no terminal status
        try:
            state = self.podman.inspect(container)
        except PodmanError:
            # Removed behind the API's back (`podman pod rm`): a kubelet reports the container killed.
            state = {"Id": "", "State": {"ExitCode": 137, "OOMKilled": False}}
        # `podman logs` writes stderr lines to its stderr: one pipe for both keeps their order.
        log = subprocess.run(["podman", "logs", container], env=podman_env(), cwd=podman_cwd(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
        with self.cond:
            self.logs[key] = bytearray(log.stdout)
        code = int(state["State"]["ExitCode"])
        oom = bool(state["State"].get("OOMKilled")) or (code == 137 and bool(state["Id"]) and kernel_oom_killed(state["Id"]))
        terminated = {"exitCode": code, "reason": "OOMKilled" if oom else ("Completed" if code == 0 else "Error"),
                      "startedAt": started, "finishedAt": now_rfc3339()}
        self.terminated[name] = {"terminated": terminated, "container": state}
        phase = "Succeeded" if code == 0 else "Failed"
        self._update(key, lambda s: s.update(phase=phase, containerStatuses=[container_status(image, {"terminated": terminated})]))
        self._finish_job(namespace, job, phase)

    def _finish_job(self, namespace: str, job: dict | None, phase: str) -> None:
        if job is None:
            return  # a bare pod (a session's, an MCP server's): no Job to finish
        with self.cond:
            live = self.jobs.get((namespace, job["metadata"]["name"]))
            if live is None:
                return
            stamp = now_rfc3339()
            if phase == "Succeeded":
                live["status"].update(active=0, succeeded=1, completionTime=stamp, conditions=[{"type": "Complete", "status": "True", "lastTransitionTime": stamp}])
            else:
                live["status"].update(active=0, failed=1, conditions=[{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit", "lastTransitionTime": stamp}])
            live["metadata"]["resourceVersion"] = self._bump()

    def _delete_pod(self, key: tuple[str, str]) -> None:
        super()._delete_pod(key)
        # Called with the API's lock held: the runtime removes the pod in the background.
        threading.Thread(target=self.podman.run, args=("pod", "rm", "--force", "--time", "0", key[1]), kwargs={"check": False}, daemon=True).start()

    def exec_process(self, key: tuple[str, str], command: list[str]) -> subprocess.Popen:
        """pods/exec as the kubelet runs it: a new process in the running container (`podman exec`,
        the container's user, working directory, environment, capabilities and seccomp filter)."""
        return subprocess.Popen(["podman", "exec", "--interactive", f"{key[1]}-{CONTAINER}", *command], env=podman_env(),
                                cwd=podman_cwd(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)

    def live_pods(self) -> list[str]:
        """Sandbox pods this API ran that podman still has."""
        names = [m["metadata"]["name"] for m in self.played]
        return [n for n in names if self.podman.run("pod", "exists", n, check=False).returncode == 0]
