"""Session sandboxes in a cluster (AGENTMESH_SANDBOX=kubernetes, AGENTMESH_SANDBOX_ISOLATION=session):
one long-lived pod per session, each call a fresh process in it, started by the session
supervisor this replica runs in the pod through one long-lived `pods/exec` stream
(k8s_supervisor.py: the protocol of a local session jail, calls multiplexed on the stream).

A session's first call takes a warm pod from the pool (k8s_pool.py) when there is one, else
creates its pod (k8s_session_pod.py; or agent-sandbox's SandboxClaim, agent_sandbox.py), waits
for it to run and opens the supervisor's stream; later calls are a request on it. Each call has
its own timeout, output bound and workspace quota (the wrapper in the pod, and our own look at
the shared claim); stopping a call kills its process group, ending the stream all of them.

A pod with no call for `idle_s` is deleted (agent-sandbox's: its claim, its files with it); the
next call starts a new one on the same workspace. Deleting the workspace deletes the pod. When the pod goes away
mid-call (deleted, evicted, its node lost) or its supervisor's stream ends, the calls on it get
a `sandbox_error` result at once, and the pod is replaced at the next call.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

import urllib3
from opentelemetry import trace

from agentmesh.logs import get_logger
from agentmesh.telemetry.genai import GEN_AI_TOOL_CALL_ID
from agentmesh.telemetry.propagation import traceparent_env
from agentmesh.tools.quota import UsageMeter, WorkspaceQuota
from agentmesh.tools.sandbox.agent_sandbox import SandboxClaims
from agentmesh.tools.sandbox.base import CellResult, CommandResult, CommandSpec, NoMetrics, SandboxMetrics
from agentmesh.tools.sandbox.k8s_api import KubeApiError, KubernetesJobs
from agentmesh.tools.sandbox.k8s_job import CONTAINER
from agentmesh.tools.sandbox.k8s_pool import WarmPool
from agentmesh.tools.sandbox.k8s_quota import claim_over_quota, name_pod_quota
from agentmesh.tools.sandbox.k8s_session_pod import build_session_pod, call_command, session_pod_name
from agentmesh.tools.sandbox.k8s_session_reap import last_used, mark_used, sweep_abandoned
from agentmesh.tools.sandbox.k8s_session_start import (
    PodStartFailed,
    api_failure,
    explain_loss,
    pod_error,
    until_running,
)
from agentmesh.tools.sandbox.k8s_supervisor import PodSupervisor
from agentmesh.tools.sandbox.supervisor_link import (
    KILL_GRACE_S,
    JailGone,
    cell_details,
    cell_reply,
    last_word,
    reply_result,
)
from agentmesh.tools.settings import KubernetesSandbox, SandboxLimits
from agentmesh.tools.workspace import Workspaces

__all__ = ["KubernetesSessionPods"]

log = get_logger("agentmesh.tools.kubernetes.session")

QUOTA_INTERVAL_S = 0.25


@dataclass
class SessionPod:
    name: str
    in_flight: int = 0
    last_used: float = 0.0
    warm: bool = False
    marked: float = 0.0  # when this replica last wrote its use into the pod (k8s_session_reap.py)
    stamp: float = 0.0  # the wall-clock time of use it wrote
    supervisor: PodSupervisor | None = None  # this replica's stream to the pod's supervisor
    claim: str = ""  # its SandboxClaim, when agent-sandbox made it (agent_sandbox.py)
    container: str = CONTAINER


class KubernetesSessionPods:
    name = "kubernetes-session"

    def __init__(self, api: KubernetesJobs, cfg: KubernetesSandbox, limits: SandboxLimits, workspaces: Workspaces | None,
                 tracer: trace.Tracer, identity: tuple[int, int], *, quota: WorkspaceQuota, idle_s: float,
                 network: bool = False, pool: WarmPool | None = None, template: str = "default",
                 metrics: SandboxMetrics | None = None, claims: SandboxClaims | None = None):
        self._api = api
        self.claims = claims
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
        # A supervisor's reply holds two capped streams, JSON-escaped (at most 6 bytes a byte).
        self._line_limit = 12 * limits.output_cap_bytes + 2**16
        self._meter = UsageMeter()
        self._pods: dict[str, SessionPod] = {}
        # Supervisor streams opened on this replica's warm pods before any claim (k8s_pool.py).
        self._ready: dict[str, PodSupervisor] = {}
        # Pods this replica is creating for a session, not in _pods until they run: its sweep of
        # abandoned pods must not take them (one whose start outlasts twice the idle time).
        self._creating: set[str] = set()
        if pool is not None:
            pool.prepare, pool.prepared = self._prepare, self._prepared
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

    async def _acquire(self, session_id: str, owner: tuple[str, str] = ("", "")) -> SessionPod:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.create_task(self._reap())
        if self.pool is not None:
            self.pool.start()
        async with self._starting.setdefault(session_id, asyncio.Lock()):
            for attempt in range(2):
                pod = self._pods.get(session_id)
                if pod is None:
                    pod = await self._start(session_id, owner)
                    self._pods[session_id] = pod
                if pod.supervisor is None or not pod.supervisor.open:
                    supervisor = PodSupervisor(pod.name, self._line_limit, pod.container)
                    try:
                        await supervisor.start(self._api)
                    except KubeApiError as exc:
                        if exc.status in (400, 404) and attempt == 0:
                            # The pod went away since the last call (reaped by another replica,
                            # deleted, its container ended): start another, once.
                            self._forget(session_id, pod)
                            continue
                        raise
                    pod.supervisor = supervisor
                pod.in_flight += 1
                return pod
        raise PodStartFailed(pod_error("sandbox_error", "the session's pod went away twice before the call could start"))

    async def _start(self, session_id: str, owner: tuple[str, str]) -> SessionPod:
        started = time.monotonic()
        if self.claims is not None:
            claimed = await self.claims.claim(session_id, *owner)
            self._metrics.record_sandbox_wait(time.monotonic() - started, self.name)
            return SessionPod(claimed.pod, claim=claimed.claim, container=claimed.container)
        workspace = self._workspace(session_id)
        if self.pool is not None:
            name = await self.pool.claim(session_id, workspace)
            if name is not None:
                self._metrics.record_sandbox_wait(time.monotonic() - started, self.name)
                log.info("session pod claimed from the warm pool", session_id=session_id, pod=name)
                return SessionPod(name, warm=True, supervisor=self._ready.pop(name, None))
        if self._workspaces is not None:
            # The session's directory exists, with the sandbox's ownership, before the pod mounts it.
            await asyncio.to_thread(self._workspaces.ensure, session_id)
        name = session_pod_name()
        body = build_session_pod(self._cfg, name, self._identity, template=self.template, session_id=session_id,
                                 network=self._network, quota_bytes=self._quota.limit_bytes)
        self._creating.add(name)
        try:
            await self._api.create_pod(body)
            try:
                await until_running(self._api, self._cfg, name, started)
            except BaseException:
                await self._delete(name)
                raise
        finally:
            self._creating.discard(name)
        self._metrics.record_sandbox_wait(time.monotonic() - started, self.name)
        log.info("session pod started", session_id=session_id, pod=name)
        return SessionPod(name)

    async def _prepare(self, name: str) -> None:
        """Open the supervisor's stream on a running warm pod of this replica's pool."""
        for gone in [pod for pod, supervisor in self._ready.items() if not supervisor.open]:
            del self._ready[gone]  # retired, or claimed through another replica and reaped
        supervisor = PodSupervisor(name, self._line_limit)
        try:
            await supervisor.start(self._api)
        except (KubeApiError, urllib3.exceptions.HTTPError, OSError) as exc:
            log.info("could not open a warm pod's supervisor ahead of its claim", pod=name, error=str(exc))
            return
        self._ready[name] = supervisor

    def _prepared(self, name: str) -> bool:
        supervisor = self._ready.get(name)
        return supervisor is not None and supervisor.open

    def _release(self, pod: SessionPod) -> None:
        pod.in_flight -= 1
        pod.last_used = time.monotonic()

    def _forget(self, session_id: str, pod: SessionPod) -> None:
        """The pod is gone or broken: the next call starts another."""
        if pod.supervisor is not None:
            pod.supervisor.close()
        if self._pods.get(session_id) is pod:
            del self._pods[session_id]
            asyncio.get_running_loop().create_task(self._delete(pod.name, pod.claim))

    # --- a call --------------------------------------------------------------------------------

    def _span(self, name: str, spec: CommandSpec) -> Any:
        return self._tracer.start_as_current_span(name, attributes={
            "agentmesh.sandbox.executor": self.name, "agentmesh.sandbox.namespace": self._cfg.namespace,
            "agentmesh.session_id": spec.session_id, GEN_AI_TOOL_CALL_ID: spec.call_id,
            "agentmesh.sandbox.timeout_s": spec.timeout_s,
        })

    async def run(self, spec: CommandSpec) -> CommandResult:
        with self._span("sandbox.k8s_exec", spec) as span:
            try:
                result = await self._run(spec, span)
            except PodStartFailed as exc:
                result = exc.result
            except KubeApiError as exc:
                result = api_failure(self._cfg.namespace, exc.status, exc.message)
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                result = api_failure(self._cfg.namespace, 0, str(exc))
            span.set_attribute("agentmesh.sandbox.exit_code", result.exit_code)
            if result.error_kind:
                span.set_attribute("agentmesh.sandbox.error_kind", result.error_kind)
            return result

    async def _acquire_for(self, spec: CommandSpec, span: Any) -> tuple[SessionPod, PodSupervisor]:
        """The session's pod, its supervisor's stream open, for one call (release it after)."""
        pod = await self._acquire(spec.session_id, (spec.tenant, spec.namespace))
        span.set_attribute("agentmesh.sandbox.pod", pod.name)
        assert pod.supervisor is not None  # _acquire opened it
        return pod, pod.supervisor

    async def _usage_before(self, session_id: str) -> tuple[Path | None, int, int]:
        """The session's workspace, its usage before a call, and the file size the quota leaves."""
        workspace = self._workspace(session_id)
        used_before = await self._meter.usage(workspace) if workspace is not None else 0
        return workspace, used_before, min(self._limits.file_size_bytes, self._quota.remaining(used_before))

    async def _run(self, spec: CommandSpec, span: Any) -> CommandResult:
        pod, supervisor = await self._acquire_for(spec, span)
        started = time.monotonic()
        try:
            workspace, used_before, file_size = await self._usage_before(spec.session_id)
            call, future = supervisor.link.request({
                "op": "exec", "argv": call_command(spec.argv, self._quota.limit_bytes, file_size),
                "env": {**spec.env, **traceparent_env()}, "inherit_env": True, "limits": {},
                "cap": self._limits.output_cap_bytes, "drain": self._limits.output_drain_bytes})
            supervisor.calls[spec.call_id] = call
            try:
                reply, timed_out, over_quota = await self._exec_reply(spec, pod, supervisor, call, future, workspace,
                                                                      used_before)
            finally:
                supervisor.calls.pop(spec.call_id, None)
            result = self._result(reply, spec, started, timed_out, over_quota)
            await name_pod_quota(result, result.stderr, workspace, used_before, self._meter, self._quota)
            return result
        except JailGone:
            return await self._lost(spec.session_id, pod, started)
        finally:
            self._release(pod)

    async def _exec_reply(self, spec: CommandSpec, pod: SessionPod, supervisor: PodSupervisor, call: int,
                          future: asyncio.Future[dict[str, Any]], workspace: Path | None,
                          used_before: int) -> tuple[dict[str, Any], bool, int]:
        """The call's reply, whether its time ran out, and the workspace's usage when it grew
        past the quota; in both cases the call is killed first."""
        watch = (asyncio.create_task(claim_over_quota(self._meter, self._quota, workspace, used_before, QUOTA_INTERVAL_S))
                 if workspace is not None else None)
        waiters: set[asyncio.Future[Any]] = {future, *([watch] if watch is not None else [])}
        try:
            done, _ = await asyncio.wait(waiters, timeout=spec.timeout_s, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            supervisor.link.signal("kill", call)  # a cancelled call's processes end at once
            raise
        finally:
            if watch is not None:
                watch.cancel()
        if future in done:
            return future.result(), False, 0
        over_quota = watch.result() if watch is not None and watch in done else 0
        supervisor.link.signal("kill", call)
        reply = await last_word(supervisor.link, call, future, "kill", self._ender(spec.session_id, pod))
        return reply, not over_quota, over_quota

    def _ender(self, session_id: str, pod: SessionPod) -> Callable[[], Awaitable[None]]:
        """How a pod whose supervisor does not answer a stopped call is ended: its stream is
        closed (the supervisor kills its calls) and the pod replaced at the next call."""
        async def end() -> None:
            log.warning("a session pod's supervisor did not answer a stopped call; replacing the pod",
                        session_id=session_id, pod=pod.name)
            self._forget(session_id, pod)

        return end

    def _result(self, reply: dict[str, Any], spec: CommandSpec, started: float, timed_out: bool,
                over_quota: int) -> CommandResult:
        result = reply_result(reply, started)
        if over_quota:
            result.exit_code, result.error_kind = -9, "disk_quota"
            result.detail = self._quota.exceeded_detail(over_quota, stopped=True)
        elif timed_out:
            result.exit_code, result.error_kind = -9, "timeout"
            result.detail = (f"the command ran past its {spec.timeout_s:g} s time limit and was stopped "
                             + ("(the session's pod did not answer, so it is replaced; the workspace stays)"
                                if reply.get("kernel_lost") else "(its processes were killed; the session's pod stays)"))
        elif reply.get("output_limit"):
            result.exit_code, result.error_kind = -9, "output_limit"
            result.detail = (f"the command wrote more than {self._limits.output_drain_bytes} bytes of output and was "
                             "stopped; redirect large output to a file in the workspace and read parts of it")
        return result

    async def _lost(self, session_id: str, pod: SessionPod, started: float) -> CommandResult:
        """The call's result when the pod's supervisor stream ended under it."""
        supervisor = pod.supervisor
        said = supervisor.stderr.decode(errors="replace").strip() if supervisor is not None else ""
        status = supervisor.status if supervisor is not None else {}
        result = pod_error("sandbox_error", "the session's pod went away while the call ran (its processes are gone; the "
                        "workspace stays; the next call starts a new pod)"
                        + (f": {status.get('message')}" if status.get("message") else "")
                        + (f" ({said[-500:]})" if said else ""))
        result.exit_code = -9
        result.duration_ms = (time.monotonic() - started) * 1000
        await explain_loss(self._api, self._cfg, result, pod.name)
        self._forget(session_id, pod)
        return result

    # --- the python tool's interpreter, a background command's output ---------------------------

    async def run_cell(self, spec: CommandSpec, code: str) -> CellResult:
        """Run `code` in the persistent interpreter of the session pod's supervisor."""
        with self._span("sandbox.k8s_cell", spec) as span:
            try:
                cell = await self._run_cell(spec, code, span)
            except PodStartFailed as exc:
                cell = CellResult(exc.result, [])
            except KubeApiError as exc:
                cell = CellResult(api_failure(self._cfg.namespace, exc.status, exc.message), [])
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                cell = CellResult(api_failure(self._cfg.namespace, 0, str(exc)), [])
            if cell.result.error_kind:
                span.set_attribute("agentmesh.sandbox.error_kind", cell.result.error_kind)
            return cell

    async def _run_cell(self, spec: CommandSpec, code: str, span: Any) -> CellResult:
        pod, supervisor = await self._acquire_for(spec, span)
        started = time.monotonic()
        try:
            workspace, used_before, file_size = await self._usage_before(spec.session_id)
            # The interpreter's per-file limit; its CPU limit and a lower file limit are per cell.
            call, future = supervisor.link.request({
                "op": "cell", "code": code, "env": {**spec.env, **traceparent_env()}, "inherit_env": True,
                "cap": self._limits.output_cap_bytes, "limits": {"fsize": self._limits.file_size_bytes},
                "cpu_s": self._limits.cpu_s, "fsize": file_size})
            over_quota = 0

            async def watch(workspace: Path) -> None:
                # The workspace past the quota interrupts the cell (the interpreter keeps its variables).
                nonlocal over_quota
                over_quota = await claim_over_quota(self._meter, self._quota, workspace, used_before, QUOTA_INTERVAL_S)
                supervisor.link.signal("interrupt", call)

            watching = asyncio.create_task(watch(workspace)) if workspace is not None else None
            try:
                reply, timed_out = await cell_reply(supervisor.link, call, future, spec.timeout_s,
                                                    self._ender(spec.session_id, pod))
            finally:
                if watching is not None:
                    watching.cancel()
            timed_out = timed_out and not over_quota
            result = self._result(reply, spec, started, timed_out, over_quota)
            await name_pod_quota(result, result.stderr, workspace, used_before, self._meter, self._quota)
            return cell_details(result, reply, spec, timed_out)
        except JailGone:
            return CellResult(await self._lost(spec.session_id, pod, started), [], kernel_lost=True)
        finally:
            self._release(pod)

    async def restart_kernel(self, session_id: str) -> None:
        pod = self._pods.get(session_id)
        if pod is None or pod.supervisor is None or not pod.supervisor.open:
            return  # no interpreter to clear: the next cell starts a fresh one anyway
        with contextlib.suppress(JailGone, TimeoutError):
            _, future = pod.supervisor.link.request({"op": "restart"})
            await asyncio.wait_for(future, KILL_GRACE_S)

    async def peek(self, session_id: str, call_id: str) -> tuple[str, str] | None:
        """(stdout, stderr) so far of a call still running in the session's pod (a background
        command), or None when it is not running there."""
        pod = self._pods.get(session_id)
        supervisor = pod.supervisor if pod is not None else None
        call = supervisor.calls.get(call_id) if supervisor is not None else None
        if supervisor is None or call is None:
            return None
        try:
            _, future = supervisor.link.request({"op": "peek", "call": call})
            reply = await asyncio.wait_for(future, KILL_GRACE_S)
        except (JailGone, TimeoutError):
            return None
        return (reply["stdout"], reply["stderr"]) if reply.get("running") else None

    # --- ending --------------------------------------------------------------------------------

    async def end_session(self, session_id: str) -> None:
        """Delete the session's pod (its workspace is being deleted, or it idled)."""
        pod = self._pods.pop(session_id, None)
        lock = self._starting.get(session_id)
        if lock is not None and not lock.locked():
            del self._starting[session_id]
        if pod is not None:
            if pod.supervisor is not None:
                pod.supervisor.close()
            await self._delete(pod.name, pod.claim)
            log.info("session pod ended", session_id=session_id, pod=pod.name)

    async def _delete(self, name: str, claim: str = "") -> None:
        if claim and self.claims is not None:
            await self.claims.release(claim)  # agent-sandbox deletes the pod
            return
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
                # Another replica uses it: it is that replica's to reap; this one lets go (and
                # ends its own supervisor stream: nothing of this replica runs there any more).
                self._pods.pop(session_id, None)
                if pod.supervisor is not None:
                    pod.supervisor.close()
                continue
            if pod.in_flight or self._pods.get(session_id) is not pod:
                continue  # a call took it while the pod was looked up
            await self.end_session(session_id)
        if self.claims is not None:
            await self.claims.sweep(lambda: {pod.claim for pod in self._pods.values()}, self._idle_s)
        else:
            await sweep_abandoned(self._api, {pod.name for pod in self._pods.values()} | self._creating, self._idle_s)

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        if self.pool is not None:
            await self.pool.close()
        for supervisor in self._ready.values():
            supervisor.close()
        self._ready.clear()
        for session_id in list(self._pods):
            await self.end_session(session_id)
        self._meter.close()
        await self._api.close()

