"""Reading a sandbox Job's progress: from pod and Job objects to "still going" or a final verdict.

Pure logic over the API's JSON (no I/O), so each case — success, exit code, OOMKilled, image
pull failure, unschedulable, deadline — is plain to read and to test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentmesh.tools.sandbox.k8s_job import CONTAINER

IMAGE_PULL_FAILURES = {"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull", "RegistryUnavailable"}
# ErrImagePull can be a passing registry hiccup the kubelet retries; the others are final.
IMAGE_PULL_FINAL = IMAGE_PULL_FAILURES - {"ErrImagePull"}
CONFIG_FAILURES = {"CreateContainerConfigError", "CreateContainerError", "RunContainerError", "ContainerCannotRun"}


@dataclass
class Verdict:
    """How a call ended. `pod` is set when there is a pod to read logs from."""

    error_kind: str = ""
    detail: str = ""
    exit_code: int = 0
    pod: str = ""


class JobTracker:
    def __init__(self, name: str, timeout_s: float, start_timeout_s: float, memory_limit: str, created_at: float):
        self.name = name
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self.memory_limit = memory_limit
        self.created_at = created_at
        self.running_since: float | None = None
        self.pod_name = ""
        self.waiting = ""  # the last reason the container was waiting for, for the start-timeout message
        self.unschedulable = ""

    def next_deadline(self) -> float:
        if self.running_since is not None:
            return self.running_since + self.timeout_s
        return self.created_at + self.start_timeout_s

    def on_pod(self, pod: dict[str, Any], now: float) -> Verdict | None:
        name = pod.get("metadata", {}).get("name", "")
        self.pod_name = name or self.pod_name
        status = pod.get("status") or {}
        for condition in status.get("conditions") or []:
            if condition.get("type") == "PodScheduled":
                if condition.get("status") == "False" and condition.get("reason") == "Unschedulable":
                    self.unschedulable = condition.get("message") or "no node can run the pod"
                elif condition.get("status") == "True":
                    self.unschedulable = ""
        container = next((c for c in status.get("containerStatuses") or [] if c.get("name") == CONTAINER), None)
        state = (container or {}).get("state") or {}
        if status.get("reason") == "Evicted":
            return self._evicted(status.get("message", ""), name)
        if "terminated" in state:
            return self._terminated(state["terminated"], name)
        if "running" in state and self.running_since is None:
            self.running_since = now
        if "waiting" in state:
            waiting = state["waiting"] or {}
            reason, message = waiting.get("reason", ""), waiting.get("message", "")
            self.waiting = f"{reason}: {message}" if message else reason
            if reason in IMAGE_PULL_FINAL:
                return Verdict("image_pull", f"the sandbox image could not be pulled ({reason}): {message or 'no detail from the kubelet'}", -1, name)
            if reason in CONFIG_FAILURES:
                return Verdict("sandbox_error", f"the sandbox container could not start ({reason}): {message}", -1, name)
        if status.get("phase") == "Failed" and "terminated" not in state:
            reason = status.get("reason", "")
            if reason == "DeadlineExceeded":
                return self._deadline()
            return Verdict("sandbox_error", f"the sandbox pod failed ({reason or 'no reason given'}): {status.get('message', '')}".rstrip(": "), -1, name)
        if status.get("phase") == "Succeeded" and not container:
            return Verdict(exit_code=0, pod=name)
        return None

    def on_job(self, job: dict[str, Any] | None) -> Verdict | None:
        if job is None:
            return Verdict("sandbox_error", f"the Job {self.name} was deleted before it finished", -1, self.pod_name)
        for condition in (job.get("status") or {}).get("conditions") or []:
            if condition.get("status") != "True":
                continue
            if condition.get("type") == "Failed" and condition.get("reason") == "DeadlineExceeded":
                return self._deadline()
            if condition.get("type") == "Failed" and not self.pod_name:
                return Verdict("sandbox_error", f"the Job failed ({condition.get('reason')}): {condition.get('message', '')}", -1)
        return None

    def on_tick(self, now: float) -> Verdict | None:
        if self.running_since is not None:
            if now - self.running_since >= self.timeout_s:
                return Verdict("timeout", f"the command ran past its {self.timeout_s:g} s time limit and was stopped (its Job was deleted)", -9, self.pod_name)
            return None
        if now - self.created_at >= self.start_timeout_s:
            if self.unschedulable:
                return Verdict("unschedulable", f"no node could run the sandbox pod within {self.start_timeout_s:g} s: {self.unschedulable}", -1, self.pod_name)
            waiting = f" (last state: {self.waiting})" if self.waiting else ""
            return Verdict("start_timeout", f"the sandbox pod did not start within {self.start_timeout_s:g} s{waiting}", -1, self.pod_name)
        return None

    def _terminated(self, terminated: dict[str, Any], pod: str) -> Verdict:
        code = int(terminated.get("exitCode", -1))
        reason = terminated.get("reason", "")
        if reason == "OOMKilled":
            return Verdict("oom", f"the command ran out of memory: the sandbox's {self.memory_limit} limit was exceeded and it was killed", code, pod)
        if reason == "DeadlineExceeded":
            return self._deadline(code)
        return Verdict(exit_code=code, pod=pod)

    def _evicted(self, message: str, pod: str) -> Verdict:
        # The kubelet evicts a pod whose emptyDir passes its sizeLimit (the workspace without a
        # claim is one, sized to the quota): "Usage of EmptyDir volume "workspace" exceeds the limit "1Gi"."
        if 'volume "workspace"' in message:
            return Verdict("disk_quota", f"the command was stopped: the workspace passed its disk quota and Kubernetes evicted the pod ({message})", -9, pod)
        return Verdict("sandbox_error", f"Kubernetes evicted the sandbox pod: {message or 'no reason given'}", -9, pod)

    def _deadline(self, code: int = -9) -> Verdict:
        return Verdict("timeout", "the sandbox Job ran past its activeDeadlineSeconds and Kubernetes stopped it", code, self.pod_name)
