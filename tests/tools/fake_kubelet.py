"""The node side of the tests' Kubernetes API server (fake_kube.py): what a kubelet and a container
runtime do with a pod once the API server has it.

- the scheduler's check: a pod whose requests exceed the node's capacity stays `Unschedulable`;
- the image "pull": anything from registry.invalid fails (ErrImagePull, then ImagePullBackOff);
- the container: its command runs as a local process, its working directory the volume (a
  PersistentVolumeClaim maps to a host directory, honouring subPath); it is killed with
  OOMKilled (exit 137) when its resident memory passes the container's memory limit; its
  combined output is the pod log; a command that cannot be executed is a StartError (exit 128),
  and `FallbackToLogsOnError` puts a failed container's last output in its status. A container
  with `stdin: true` (an MCP server's bare pod) gets a stdin pipe for pods/attach, its stdout and
  stderr kept apart for attach's channels.

`Kubelet` is FakeKube's base: it works on FakeKube's state (`pods`, `logs`, `procs`, `attached`,
under `cond`) and reports through its `_update`, so a subclass (the image tests' PodmanKube) can
run pods its own way by overriding `_run_pod`. The local process is not isolated: this is a
stand-in for a container runtime, not a sandbox.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

__all__ = ["Kubelet", "container_status", "kill_container", "now_rfc3339", "process_tree", "quantity"]

UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "m": 1e-3}
# How long after an OOM kill the pod's status says so (see _run_pod).
OOM_STATUS_LAG_S = 0.5


def quantity(value: str) -> float:
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(value))
    if not match:
        raise ValueError(f"bad quantity {value!r}")
    number, unit = match.groups()
    return float(number) * UNITS.get(unit, 1)


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")



class Kubelet:
    # FakeKube's state, which this works on; FakeKube's `_update` (a pod's status changed), `_bump`
    # (a new resourceVersion) and `_detach_all` (the container ended) say what happened.
    pods: dict[tuple[str, str], dict]
    jobs: dict[tuple[str, str], dict]
    logs: dict[tuple[str, str], bytearray]
    procs: dict[tuple[str, str], subprocess.Popen]
    exec_procs: dict[tuple[str, str], list[subprocess.Popen]]
    workdirs: dict[tuple[str, str], int]
    node: dict[str, float]
    cond: threading.Condition
    instant_containers: bool
    start_delay_s: float
    _scratch: tempfile.TemporaryDirectory

    def _run_pod(self, namespace: str, job: dict | None, key: tuple[str, str]) -> None:
        spec = self.pods[key]["spec"]
        container = spec["containers"][0]
        requests = container.get("resources", {}).get("requests", {})
        short = [r for r in ("cpu", "memory") if r in requests and quantity(requests[r]) > self.node[r]]
        if short:
            message = f"0/1 nodes are available: {', '.join('1 Insufficient ' + r for r in short)}. preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."
            self._update(key, lambda s: s["conditions"].append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}))
            return
        self._update(key, lambda s: s["conditions"].append({"type": "PodScheduled", "status": "True"}))
        image = container["image"]
        if image.startswith("registry.invalid/"):
            pull = f'failed to pull and unpack image "{image}": failed to resolve reference: dial tcp: lookup registry.invalid: no such host'
            self._update(key, lambda s: s.update(containerStatuses=[container_status(container["image"], {"waiting": {"reason": "ErrImagePull", "message": pull}}, name=container["name"])]))
            time.sleep(0.2)
            self._update(key, lambda s: s.update(containerStatuses=[container_status(container["image"], {"waiting": {"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{image}"'}}, name=container["name"])]))
            return
        time.sleep(self.start_delay_s)
        if self.instant_containers:
            with self.cond:
                self.logs[key] = bytearray(b"ok\n")
            stamp = now_rfc3339()
            self._update(key, lambda s: s.update(phase="Succeeded", containerStatuses=[container_status(container["image"], {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": stamp, "finishedAt": stamp}}, name=container["name"])]))
            return
        cwd = self._volume_dir(spec, container)
        with self.cond:
            # Held open for pods/exec: a renamed directory (a claimed warm pod's) stays the pod's.
            self.workdirs[key] = os.open(cwd, os.O_RDONLY | os.O_DIRECTORY)
        env = {e["name"]: e["value"] for e in container.get("env", [])}
        env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
        # A container with `stdin: true` (an MCP server pod) keeps stdin open for pods/attach, and
        # its stdout and stderr apart (attach's channels 1 and 2); the log has both.
        interactive = bool(container.get("stdin"))
        with self.cond:
            if key not in self.pods:
                return
            self.logs[key] = bytearray()
            try:
                proc = subprocess.Popen(container["command"], cwd=cwd, env=env,
                                        stdin=subprocess.PIPE if interactive else subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE if interactive else subprocess.STDOUT, start_new_session=True)
            except OSError as exc:
                proc = None
                start_error = exc
            else:
                self.procs[key] = proc
        if proc is None:
            self._start_failed(namespace, job, key, container, start_error)
            return
        started = now_rfc3339()
        self._update(key, lambda s: s.update(phase="Running", containerStatuses=[container_status(container["image"], {"running": {"startedAt": started}}, ready=True, name=container["name"])]))
        limit = quantity(container.get("resources", {}).get("limits", {}).get("memory", "0") or "0")
        oom = threading.Event()
        threading.Thread(target=self._memory_guard, args=(proc, limit, oom, key), daemon=True).start()
        try:
            if interactive:
                errors = threading.Thread(target=self._copy_output, args=(key, proc.stderr, 2), daemon=True)
                errors.start()
                self._copy_output(key, proc.stdout, 1)
                errors.join()
            else:
                self._copy_output(key, proc.stdout, 1)
            code = proc.wait()
            with self.cond:
                if self.procs.pop(key, None) is None:
                    return  # deleted (job deleted or deadline): no terminal status
            if oom.is_set():
                # A kubelet writes a container's end a moment after it died (its relist, up to a
                # second): whoever saw the end first — an exec stream closing — reads a pod not yet
                # marked OOMKilled.
                time.sleep(OOM_STATUS_LAG_S)
                terminated = {"exitCode": 137, "reason": "OOMKilled"}
            else:
                terminated = {"exitCode": code if code >= 0 else 128 - code, "reason": "Completed" if code == 0 else "Error"}
            if terminated["exitCode"] and container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
                with self.cond:
                    tail = bytes(self.logs.get(key, b""))[-2048:].decode(errors="replace").splitlines()[-80:]
                if tail:
                    terminated["message"] = "\n".join(tail) + "\n"
            terminated.update(startedAt=started, finishedAt=now_rfc3339())
            self._finish(namespace, job, key, container, terminated)
        finally:
            self._detach_all(key)

    def _copy_output(self, key: tuple[str, str], stream, channel: int) -> None:
        """The container's output into its log and to every attached stream."""
        for chunk in iter(lambda: stream.read1(65536), b""):
            with self.cond:
                if key in self.logs:
                    self.logs[key] += chunk
                sinks = list(self.attached.get(key, ()))
            for sink in sinks:
                sink(channel, chunk)

    def _start_failed(self, namespace: str, job: dict | None, key: tuple[str, str], container: dict, exc: OSError) -> None:
        """The runtime could not exec the command: what containerd reports (StartError, exit 128)."""
        command = container["command"][0]
        if os.path.isabs(command):
            why = f"exec: \"{command}\": stat {command}: no such file or directory" if isinstance(exc, FileNotFoundError) else f"exec: \"{command}\": {exc.strerror}"
        else:
            why = f"exec: \"{command}\": executable file not found in $PATH"
        message = f"failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: {why}: unknown"
        stamp = now_rfc3339()
        self._finish(namespace, job, key, container, {"exitCode": 128, "reason": "StartError", "message": message, "startedAt": stamp, "finishedAt": stamp})

    def _finish(self, namespace: str, job: dict | None, key: tuple[str, str], container: dict, terminated: dict) -> None:
        phase = "Succeeded" if terminated["exitCode"] == 0 else "Failed"
        self._update(key, lambda s: s.update(phase=phase, containerStatuses=[container_status(container["image"], {"terminated": terminated}, name=container["name"])]))
        if job is None:
            return
        with self.cond:
            live = self.jobs.get((namespace, job["metadata"]["name"]))
            if live is not None:
                stamp = now_rfc3339()
                if phase == "Succeeded":
                    live["status"].update(active=0, succeeded=1, completionTime=stamp, conditions=[{"type": "SuccessCriteriaMet", "status": "True"}, {"type": "Complete", "status": "True", "lastTransitionTime": stamp}])
                else:
                    live["status"].update(active=0, failed=1, conditions=[{"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded"}, {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit", "lastTransitionTime": stamp}])
                live["metadata"]["resourceVersion"] = self._bump()

    def _memory_guard(self, proc: subprocess.Popen, limit: float, oom: threading.Event, key: tuple[str, str] | None = None) -> None:
        """The cgroup OOM killer's stand-in: SIGKILL the container when its processes' resident memory
        together passes the limit (a cgroup counts them all, the command's children and processes
        exec'd into the container included; with cgroup v2 the kubelet has the whole container killed)."""
        while limit and proc.poll() is None:
            rss = 0
            with self.cond:
                execs = list(self.exec_procs.get(key, ())) if key is not None else []
            pids = [pid for root in (proc, *execs) for pid in process_tree(root.pid)]
            for pid in pids:
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                    rss += int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024
                except (OSError, AttributeError):
                    continue
            if rss > limit:
                oom.set()
                for running in execs:
                    kill_container(running)
                kill_container(proc)
                return
            time.sleep(0.01)

    def _volume_dir(self, spec: dict, container: dict) -> str:
        mount = next((m for m in container.get("volumeMounts", []) if m["mountPath"] == container.get("workingDir", "/workspace")), None)
        if mount is None:
            return tempfile.mkdtemp(dir=self._scratch.name)  # the image's own working directory
        volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
        if "persistentVolumeClaim" in volume:
            base = self.volumes[volume["persistentVolumeClaim"]["claimName"]]
        else:
            base = Path(tempfile.mkdtemp(dir=self._scratch.name))
        path = Path(base) / mount.get("subPath", "")
        path.mkdir(parents=True, exist_ok=True)  # the kubelet creates a missing subPath
        return str(path)


def container_status(image: str, state: dict, ready: bool = False, name: str = "sandbox") -> dict:
    return {"name": name, "image": image, "imageID": "", "ready": ready, "restartCount": 0, "started": "running" in state, "state": state}



def process_tree(root: int) -> list[int]:
    """`root` and its descendants (a container's processes, which a real pod's PID namespace holds)."""
    found, pending = [], [root]
    while pending:
        pid = pending.pop()
        found.append(pid)
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                pending.extend(int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split())
        except (OSError, ValueError):
            continue
    return found


def kill_container(proc: subprocess.Popen) -> None:
    """End the container: its process group and every descendant's group (the command may run in a
    session of its own), as the end of a pod's PID namespace would."""
    own = os.getpgrp()
    for pid in process_tree(proc.pid):
        try:
            group = os.getpgid(pid)
            if group != own:
                os.killpg(group, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
