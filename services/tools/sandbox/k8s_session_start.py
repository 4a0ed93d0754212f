"""A session pod's start (k8s_session.py): waiting for it to run, and why it did not."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from agentmesh.tools.sandbox.base import CommandResult
from agentmesh.tools.sandbox.k8s_api import KubernetesJobs
from agentmesh.tools.sandbox.k8s_session_pod import LABEL_SANDBOX_POD
from agentmesh.tools.sandbox.k8s_watch import JobTracker
from agentmesh.tools.settings import KubernetesSandbox

__all__ = ["PodStartFailed", "pod_error", "until_running"]

WATCH_WINDOW_S = 30


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
