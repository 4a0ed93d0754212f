"""Session sandboxes in a cluster (AGENTMESH_SANDBOX=kubernetes, AGENTMESH_SANDBOX_ISOLATION=session):
one long-lived pod per session, each call a fresh process in it through `pods/exec`.

A session's first call takes a warm pod from the pool (k8s_pool.py) when there is one, else
creates its pod (k8s_session_pod.py) and waits for it to run; later calls exec at once. Each call
has its own timeout, output bound and workspace quota (the wrapper in the pod, and the tools
service's own look at the shared claim); ending a call's stream ends its process group.

A pod with no call for `idle_s` is deleted; the next call starts a new one on the same workspace
(the shared claim's session directory). Deleting the workspace deletes the pod. When the pod
goes away mid-call (deleted, evicted, its node lost), the call's stream ends without an exit
status and the call gets a `sandbox_error` result at once; the next call starts a new pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3
from opentelemetry import trace

from agentmesh.logs import get_logger
from agentmesh.telemetry.genai import GEN_AI_TOOL_CALL_ID
from agentmesh.telemetry.propagation import traceparent_env
from agentmesh.tools.quota import UsageMeter, WorkspaceQuota
from agentmesh.tools.sandbox.base import CommandResult, CommandSpec, NoMetrics, SandboxMetrics
from agentmesh.tools.sandbox.k8s_api import KubeApiError, KubernetesJobs
from agentmesh.tools.sandbox.k8s_exec import ExecEnd, follow
from agentmesh.tools.sandbox.k8s_job import CONTAINER
from agentmesh.tools.sandbox.k8s_pool import WarmPool
from agentmesh.tools.sandbox.k8s_quota import name_pod_quota
from agentmesh.tools.sandbox.k8s_session_pod import LABEL_SANDBOX_POD, build_session_pod, call_command, session_pod_name
from agentmesh.tools.sandbox.k8s_session_reap import last_used, mark_used, sweep_abandoned
from agentmesh.tools.sandbox.k8s_watch import JobTracker
from agentmesh.tools.settings import KubernetesSandbox, SandboxLimits
from agentmesh.tools.workspace import Workspaces

__all__ = ["KubernetesSessionPods"]

log = get_logger("agentmesh.tools.kubernetes.session")

WATCH_WINDOW_S = 30
KILLED = 128 + 9  # SIGKILL's exit code
QUOTA_INTERVAL_S = 0.25


class PodStartFailed(Exception):
    def __init__(self, result: CommandResult):
        super().__init__(result.detail)
        self.result = result


@dataclass
class SessionPod:
    name: str
    in_flight: int = 0
    last_used: float = 0.0
    warm: bool = False
    marked: float = 0.0  # when this replica last wrote its use into the pod (k8s_session_reap.py)
    stamp: float = 0.0  # the wall-clock time of use it wrote


class KubernetesSessionPods:
    name = "kubernetes-session"

    def __init__(self, api: KubernetesJobs, cfg: KubernetesSandbox, limits: SandboxLimits, workspaces: Workspaces | None,
                 tracer: trace.Tracer, identity: tuple[int, int], *, quota: WorkspaceQuota, idle_s: float,
                 network: bool = False, pool: WarmPool | None = None, template: str = "default",
                 metrics: SandboxMetrics | None = None):
        self._api = api
        self._cfg = cfg
        self._limits = limits
        self._workspaces = workspaces if cfg.workspace_pvc else None
        self._tracer = tracer
        self._identity = identity
        self._quota = quota
        self._idle_s = idle_s
        self._network = network
        self.pool = pool
        self.template = template
        self._metrics = metrics or NoMetrics()
        self._meter = UsageMeter()
        self._pods: dict[str, SessionPod] = {}
        self._starting: dict[str, asyncio.Lock] = {}
        self._reaper: asyncio.Task[None] | None = None

    @property
    def api(self) -> KubernetesJobs:
        return self._api

    @property
    def identity(self) -> tuple[int, int]:
        return self._identity

    def start(self) -> None:
        """Start filling the warm pool (in the background; it is also started by the first call)."""
        if self.pool is not None:
            self.pool.start()

    def pod_of(self, session_id: str) -> str:
        """The name of the session's pod in this replica ("" when it has none)."""
        pod = self._pods.get(session_id)
        return pod.name if pod is not None else ""

    # --- the session's pod ---------------------------------------------------------------------

    def _workspace(self, session_id: str) -> Path | None:
        return self._workspaces.path(session_id) if self._workspaces is not None else None

    async def _acquire(self, session_id: str) -> SessionPod:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.create_task(self._reap())
        if self.pool is not None:
            self.pool.start()
        async with self._starting.setdefault(session_id, asyncio.Lock()):
            pod = self._pods.get(session_id)
            if pod is None:
                pod = await self._start(session_id)
                self._pods[session_id] = pod
            pod.in_flight += 1
            return pod

    async def _start(self, session_id: str) -> SessionPod:
        started = time.monotonic()
        workspace = self._workspace(session_id)
        if self.pool is not None:
            name = await self.pool.claim(session_id, workspace)
            if name is not None:
                self._metrics.record_sandbox_wait(time.monotonic() - started, self.name)
                log.info("session pod claimed from the warm pool", session_id=session_id, pod=name)
                return SessionPod(name, warm=True)
        if self._workspaces is not None:
            # The session's directory exists, with the sandbox's ownership, before the pod mounts it.
            await asyncio.to_thread(self._workspaces.ensure, session_id)
        name = session_pod_name()
        body = build_session_pod(self._cfg, name, self._identity, template=self.template, session_id=session_id,
                                 network=self._network, quota_bytes=self._quota.limit_bytes)
        await self._api.create_pod(body)
        try:
            await self._until_running(name, started)
        except BaseException:
            await self._delete(name)
            raise
        self._metrics.record_sandbox_wait(time.monotonic() - started, self.name)
        log.info("session pod started", session_id=session_id, pod=name)
        return SessionPod(name)

    async def _until_running(self, name: str, started: float) -> None:
        tracker = JobTracker(name, 0, self._cfg.start_timeout_s, self._cfg.memory_limit, started)
        selector = f"{LABEL_SANDBOX_POD}={name}"

        def judge(pod: dict[str, Any]) -> bool:
            verdict = tracker.on_pod(pod, time.monotonic())
            if verdict is not None:
                raise PodStartFailed(CommandResult(exit_code=-1, stdout="", stderr="", error_kind=verdict.error_kind or "sandbox_error",
                                                   detail=verdict.detail or "the session's pod ended before it ran"))
            return tracker.running_since is not None

        try:
            async with asyncio.timeout(self._cfg.start_timeout_s):
                while True:
                    pods, version = await self._api.list_pods(selector)
                    if not pods:
                        raise PodStartFailed(_error("sandbox_error", f"the session's pod {name} was deleted before it started"))
                    if any(judge(pod) for pod in pods):
                        return
                    async for event, pod in self._api.watch_pods(selector, version, WATCH_WINDOW_S):
                        if event == "DELETED":
                            raise PodStartFailed(_error("sandbox_error", f"the session's pod {name} was deleted before it started"))
                        if event in ("ADDED", "MODIFIED") and judge(pod):
                            return
        except TimeoutError:
            verdict = tracker.on_tick(started + self._cfg.start_timeout_s)
            detail = verdict.detail if verdict else f"the session's pod did not start within {self._cfg.start_timeout_s:g} s"
            raise PodStartFailed(_error(verdict.error_kind if verdict else "start_timeout", detail)) from None

    def _release(self, pod: SessionPod) -> None:
        pod.in_flight -= 1
        pod.last_used = time.monotonic()

    def _forget(self, session_id: str, pod: SessionPod) -> None:
        """The pod is gone or broken: the next call starts another."""
        if self._pods.get(session_id) is pod:
            del self._pods[session_id]
            asyncio.get_running_loop().create_task(self._delete(pod.name))

    # --- a call --------------------------------------------------------------------------------

    async def run(self, spec: CommandSpec) -> CommandResult:
        with self._tracer.start_as_current_span("sandbox.k8s_exec", attributes={
            "agentmesh.sandbox.executor": self.name, "agentmesh.sandbox.namespace": self._cfg.namespace,
            "agentmesh.session_id": spec.session_id, GEN_AI_TOOL_CALL_ID: spec.call_id,
            "agentmesh.sandbox.timeout_s": spec.timeout_s,
        }) as span:
            try:
                result = await self._run(spec, span)
            except PodStartFailed as exc:
                result = exc.result
            except KubeApiError as exc:
                result = _api_failure(self._cfg.namespace, exc.status, exc.message)
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                result = _api_failure(self._cfg.namespace, 0, str(exc))
            span.set_attribute("agentmesh.sandbox.exit_code", result.exit_code)
            if result.error_kind:
                span.set_attribute("agentmesh.sandbox.error_kind", result.error_kind)
            return result

    async def _run(self, spec: CommandSpec, span: Any) -> CommandResult:
        for attempt in range(2):
            pod = await self._acquire(spec.session_id)
            span.set_attribute("agentmesh.sandbox.pod", pod.name)
            try:
                started = time.monotonic()
                workspace = self._workspace(spec.session_id)
                used_before = await self._meter.usage(workspace) if workspace is not None else 0
                env = {**spec.env, **traceparent_env()}
                file_size = min(self._limits.file_size_bytes, self._quota.remaining(used_before))
                command = call_command(spec.argv, env, self._quota.limit_bytes, file_size)
                connecting = asyncio.ensure_future(self._api.exec(pod.name, CONTAINER, command))
                try:
                    socket = await asyncio.shield(connecting)
                except asyncio.CancelledError:
                    # A stream opened after the cancel is closed, which ends the call's lifeline.
                    connecting.add_done_callback(_close_stream)
                    raise
                except KubeApiError as exc:
                    if exc.status in (400, 404) and attempt == 0:
                        # The pod went away since the last call (reaped by another replica, deleted,
                        # its container ended): start another, once.
                        self._forget(spec.session_id, pod)
                        continue
                    raise
                end, timed_out, over_quota = await self._follow(socket, spec, workspace, used_before)
                result = self._result(end, spec, started, timed_out, over_quota)
                if end.exit_code == KILLED and not result.error_kind and await self._pod_ended(pod.name):
                    # The runtime killed the container under the call (its pod deleted, evicted,
                    # OOM-killed): some API servers report that as the exec's exit code 137.
                    end.lost = True
                    result = self._result(end, spec, started, timed_out, over_quota)
                if end.lost or end.failure:
                    await self._explain_loss(result, pod)
                    self._forget(spec.session_id, pod)
                await name_pod_quota(result, result.stderr, workspace, used_before, self._meter, self._quota)
                return result
            finally:
                self._release(pod)
        raise PodStartFailed(_error("sandbox_error", "the session's pod went away twice before the call could start"))

    async def _follow(self, socket: Any, spec: CommandSpec, workspace: Path | None,
                      used_before: int) -> tuple[ExecEnd, bool, int]:
        stop = threading.Event()
        loop = asyncio.get_running_loop()
        reading: asyncio.Future[ExecEnd] = loop.create_future()

        def read() -> None:
            # A thread of its own per call (not the loop's small default pool): a session's calls
            # and the pool's claims all stream at once.
            end = follow(socket, self._limits.output_cap_bytes, self._limits.output_drain_bytes, stop)
            loop.call_soon_threadsafe(_settle, reading, end)

        threading.Thread(target=read, name="kube-exec", daemon=True).start()
        watch = asyncio.create_task(self._watch_disk(workspace, used_before)) if workspace is not None else None
        waiters: set[asyncio.Future[Any]] = {reading, *([watch] if watch is not None else [])}
        timed_out, over_quota = False, 0
        try:
            done, _ = await asyncio.wait(waiters, timeout=spec.timeout_s, return_when=asyncio.FIRST_COMPLETED)
            if reading not in done:
                if watch is not None and watch in done:
                    over_quota = watch.result()
                else:
                    timed_out = True
                stop.set()
            return await asyncio.shield(reading), timed_out, over_quota
        except asyncio.CancelledError:
            stop.set()  # ends the stream: the wrapper in the pod kills the call's processes
            raise
        finally:
            if watch is not None:
                watch.cancel()

    async def _watch_disk(self, workspace: Path, used_before: int) -> int:
        """The workspace's usage once it passes the quota (the tools service's own look at the claim)."""
        interval = QUOTA_INTERVAL_S
        while True:
            await asyncio.sleep(interval)
            began = time.monotonic()
            with contextlib.suppress(OSError):
                usage = await self._meter.usage(workspace)
                if self._quota.over(usage) and usage > used_before:
                    return usage
            interval = max(QUOTA_INTERVAL_S, 4 * (time.monotonic() - began))

    def _result(self, end: ExecEnd, spec: CommandSpec, started: float, timed_out: bool, over_quota: int) -> CommandResult:
        result = CommandResult(exit_code=end.exit_code if end.exit_code is not None else -1,
                               stdout=end.stdout.text(), stderr=end.stderr.text(),
                               truncated=end.stdout.truncated or end.stderr.truncated,
                               duration_ms=(time.monotonic() - started) * 1000)
        if over_quota:
            result.exit_code, result.error_kind = -9, "disk_quota"
            result.detail = self._quota.exceeded_detail(over_quota, stopped=True)
        elif timed_out:
            result.exit_code, result.error_kind = -9, "timeout"
            result.detail = (f"the command ran past its {spec.timeout_s:g} s time limit and was stopped "
                             "(its processes were killed; the session's pod stays)")
        elif end.output_limit:
            result.exit_code, result.error_kind = -9, "output_limit"
            result.detail = (f"the command wrote more than {self._limits.output_drain_bytes} bytes of output and was "
                             "stopped; redirect large output to a file in the workspace and read parts of it")
        elif end.lost:
            result.exit_code, result.error_kind = -9, "sandbox_error"
            result.detail = ("the session's pod went away while the call ran (its processes are gone; the workspace "
                             "stays; the next call starts a new pod)")
        elif end.failure:
            result.exit_code, result.error_kind = -1, "sandbox_error"
            result.detail = f"the session's pod could not run the call: {end.failure}"
        return result

    async def _pod_ended(self, name: str, patience_s: float = 1.5) -> bool:
        """Whether the pod is gone, going or its container ended (the kubelet reports it a moment
        after the exec's stream ends, so ask a few times)."""
        deadline = time.monotonic() + patience_s
        while True:
            try:
                pod = await self._api.get_pod(name)
            except (KubeApiError, urllib3.exceptions.HTTPError, OSError):
                return False
            if pod is None or pod["metadata"].get("deletionTimestamp"):
                return True
            statuses = (pod.get("status") or {}).get("containerStatuses") or []
            if any("running" not in (status.get("state") or {}) for status in statuses):
                return True
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.1)

    async def _explain_loss(self, result: CommandResult, pod: SessionPod) -> None:
        """Name the reason when the pod's container ended for its memory limit."""
        with contextlib.suppress(KubeApiError, urllib3.exceptions.HTTPError, OSError):
            found = await self._api.get_pod(pod.name)
            for status in ((found or {}).get("status") or {}).get("containerStatuses") or []:
                if ((status.get("state") or {}).get("terminated") or {}).get("reason") == "OOMKilled":
                    result.error_kind = "oom"
                    result.detail = (f"the session's pod ran out of memory: its {self._cfg.memory_limit} limit was "
                                     "exceeded and it was killed (the workspace stays; the next call starts a new pod)")


    # --- ending --------------------------------------------------------------------------------

    async def end_session(self, session_id: str) -> None:
        """Delete the session's pod (its workspace is being deleted, or it idled)."""
        pod = self._pods.pop(session_id, None)
        lock = self._starting.get(session_id)
        if lock is not None and not lock.locked():
            del self._starting[session_id]
        if pod is not None:
            await self._delete(pod.name)
            log.info("session pod ended", session_id=session_id, pod=pod.name)

    async def _delete(self, name: str) -> None:
        deletion = asyncio.ensure_future(self._api.delete_pod(name))
        try:
            await asyncio.shield(deletion)
        except asyncio.CancelledError:
            await asyncio.wait({deletion}, timeout=10)
            raise
        except Exception as exc:  # noqa: BLE001 - the next start's sweep or a person removes it; say so
            log.warning("could not delete a session pod", pod=name, error=str(exc))

    async def _reap(self) -> None:
        interval = max(min(self._idle_s / 4, 10.0), 0.05)
        while True:
            await asyncio.sleep(interval)
            try:
                await self._reap_once()
            except (KubeApiError, urllib3.exceptions.HTTPError, OSError) as exc:
                log.info("session pod reaping failed; trying again", error=str(exc))

    async def _reap_once(self) -> None:
        now = time.monotonic()
        for session_id, pod in list(self._pods.items()):
            if pod.in_flight or pod.last_used > pod.marked:
                if now - pod.marked >= self._idle_s / 4:
                    pod.marked = now
                    pod.stamp = time.time() - (0 if pod.in_flight else now - pod.last_used)
                    await mark_used(self._api, pod.name, pod.stamp)
                continue
            if now - pod.last_used < self._idle_s:
                continue
            lock = self._starting.get(session_id)
            if (lock is not None and lock.locked()) or self._pods.get(session_id) is not pod:
                continue
            found = await self._api.get_pod(pod.name)
            used = last_used(found) if found is not None else 0.0
            if used > pod.stamp + 1 and time.time() - used < self._idle_s:
                # Another replica uses it: it is that replica's to reap; this one lets go.
                self._pods.pop(session_id, None)
                continue
            if pod.in_flight or self._pods.get(session_id) is not pod:
                continue  # a call took it while the pod was looked up
            await self.end_session(session_id)
        await sweep_abandoned(self._api, {pod.name for pod in self._pods.values()}, self._idle_s)

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        if self.pool is not None:
            await self.pool.close()
        for session_id in list(self._pods):
            await self.end_session(session_id)
        self._meter.close()
        await self._api.close()


def _close_stream(connecting: asyncio.Future[Any]) -> None:
    if not connecting.cancelled() and connecting.exception() is None:
        with contextlib.suppress(Exception):
            connecting.result().close()


def _settle(future: asyncio.Future[ExecEnd], end: ExecEnd) -> None:
    if not future.done():
        future.set_result(end)


def _error(kind: str, detail: str) -> CommandResult:
    return CommandResult(exit_code=-1, stdout="", stderr="", error_kind=kind, detail=detail)


def _api_failure(namespace: str, status: int, message: str) -> CommandResult:
    if status in (401, 403):
        detail = (f"the Kubernetes API refused the tools service ({status}): {message}. With session sandboxes its "
                  f"service account needs create/get/list/watch/delete/patch on pods and create/get on pods/exec in "
                  f"namespace {namespace}")
    elif status:
        detail = f"the Kubernetes API failed ({status}): {message}"
    else:
        detail = f"the Kubernetes API could not be reached: {message}"
    return _error("sandbox_unavailable", detail)
