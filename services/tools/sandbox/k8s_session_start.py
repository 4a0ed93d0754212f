"""A session pod's start (k8s_session.py): waiting for it to run, and why it did not."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import urllib3

from agentmesh.tools.sandbox.base import CommandResult
from agentmesh.tools.sandbox.k8s_api import KubeApiError, KubernetesJobs
from agentmesh.tools.sandbox.k8s_session_pod import LABEL_SANDBOX_POD
from agentmesh.tools.sandbox.k8s_watch import JobTracker
from agentmesh.tools.settings import KubernetesSandbox

__all__ = ["PodStartFailed", "api_failure", "explain_loss", "pod_error", "until_running"]

WATCH_WINDOW_S = 30
# How long a lost call waits for the kubelet to write why its pod's container ended (explain_loss).
LOSS_STATUS_WAIT_S = 5.0
LOSS_STATUS_POLL_S = 0.2


class PodStartFailed(Exception):
    def __init__(self, result: CommandResult):
        super().__init__(result.detail)
        self.result = result


def pod_error(kind: str, detail: str) -> CommandResult:
    return CommandResult(exit_code=-1, stdout="", stderr="", error_kind=kind, detail=detail)


async def until_running(api: KubernetesJobs, cfg: KubernetesSandbox, name: str, started: float) -> None:
    """Wait for the session's new pod to run; PodStartFailed says why it did not."""
    tracker = JobTracker(name, 0, cfg.start_timeout_s, cfg.memory_limit, started)
    selector = f"{LABEL_SANDBOX_POD}={name}"

    def judge(pod: dict[str, Any]) -> bool:
        verdict = tracker.on_pod(pod, time.monotonic())
        if verdict is not None:
            raise PodStartFailed(CommandResult(exit_code=-1, stdout="", stderr="", error_kind=verdict.error_kind or "sandbox_error",
                                               detail=verdict.detail or "the session's pod ended before it ran"))
        return tracker.running_since is not None

    try:
        async with asyncio.timeout(cfg.start_timeout_s):
            while True:
                pods, version = await api.list_pods(selector)
                if not pods:
                    raise PodStartFailed(pod_error("sandbox_error", f"the session's pod {name} was deleted before it started"))
                if any(judge(pod) for pod in pods):
                    return
                async for event, pod in api.watch_pods(selector, version, WATCH_WINDOW_S):
                    if event == "DELETED":
                        raise PodStartFailed(pod_error("sandbox_error", f"the session's pod {name} was deleted before it started"))
                    if event in ("ADDED", "MODIFIED") and judge(pod):
                        return
    except TimeoutError:
        verdict = tracker.on_tick(started + cfg.start_timeout_s)
        detail = verdict.detail if verdict else f"the session's pod did not start within {cfg.start_timeout_s:g} s"
        raise PodStartFailed(pod_error(verdict.error_kind if verdict else "start_timeout", detail)) from None


def api_failure(namespace: str, status: int, message: str) -> CommandResult:
    if status in (401, 403):
        detail = (f"the Kubernetes API refused the tools service ({status}): {message}. With session sandboxes its "
                  f"service account needs create/get/list/watch/delete/patch on pods and create/get on pods/exec in "
                  f"namespace {namespace}")
    elif status:
        detail = f"the Kubernetes API failed ({status}): {message}"
    else:
        detail = f"the Kubernetes API could not be reached: {message}"
    return pod_error("sandbox_unavailable", detail)


async def explain_loss(api: KubernetesJobs, cfg: KubernetesSandbox, result: CommandResult, pod: str) -> None:
    """Name the reason when a session pod's container ended for its memory limit.

    The stream ends when the container dies; the kubelet writes the container's end into the pod's
    status a moment later (seconds on a busy node). So the pod is read until a container shows
    its end, or the pod is gone, for up to LOSS_STATUS_WAIT_S — a wait only a lost call pays."""
    deadline = time.monotonic() + LOSS_STATUS_WAIT_S
    with contextlib.suppress(KubeApiError, urllib3.exceptions.HTTPError, OSError):
        while True:
            found = await api.get_pod(pod)
            ended = [((status.get("state") or {}).get("terminated") or {})
                     for status in ((found or {}).get("status") or {}).get("containerStatuses") or []]
            if any(end.get("reason") == "OOMKilled" for end in ended):
                result.error_kind = "oom"
                result.detail = (f"the session's pod ran out of memory: its {cfg.memory_limit} limit was "
                                 "exceeded and it was killed (the workspace stays; the next call starts a new pod)")
                return
            deleted = found is None or bool((found.get("metadata") or {}).get("deletionTimestamp"))
            if deleted or any(ended) or time.monotonic() >= deadline:
                return  # a pod being deleted was not killed for its memory: nothing to wait for
            await asyncio.sleep(LOSS_STATUS_POLL_S)
