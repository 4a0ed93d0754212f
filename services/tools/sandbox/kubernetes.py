"""The Kubernetes executor (AGENTMESH_SANDBOX=kubernetes): each call is one batch/v1 Job.

create Job -> follow its pod (list, then watch from that resourceVersion; Job status when the
pod disappears) -> a verdict -> the pod's log -> delete the Job (propagationPolicy Background).
The delete runs on success, failure, timeout and cancel alike; `ttlSecondsAfterFinished` is the
backstop when even that fails.

Workspace quota: the pod's own wrapper (`k8s_quota.py`) bounds each file and stops a runaway
program within a tenth of a second. A hostile program can kill that loop (it runs as the
program's uid), so when the service mounts the workspace claim it also measures the session's
directory itself while the pod runs, and deletes the Job when the workspace passes its quota.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import urllib3
from kubernetes import client, config
from opentelemetry import trace

from agentmesh.config import ConfigError
from agentmesh.logs import get_logger
from agentmesh.telemetry.genai import GEN_AI_TOOL_CALL_ID
from agentmesh.telemetry.propagation import traceparent_env
from agentmesh.tools.quota import UsageMeter, WorkspaceQuota
from agentmesh.tools.sandbox.base import CommandResult, CommandSpec, NoMetrics, SandboxMetrics
from agentmesh.tools.sandbox.k8s_api import KubeApiError, KubernetesJobs
from agentmesh.tools.sandbox.k8s_job import CONTAINER, LABEL_JOB, build_job, job_name, pod_identity
from agentmesh.tools.sandbox.k8s_quota import name_pod_quota
from agentmesh.tools.sandbox.k8s_watch import JobTracker, Verdict
from agentmesh.tools.sandbox.output import CappedOutput
from agentmesh.tools.settings import KubernetesSandbox, SandboxLimits, ToolsSettings
from agentmesh.tools.workspace import Workspaces

log = get_logger("agentmesh.tools.kubernetes")

WATCH_WINDOW_S = 30
# How often the service measures a running pod's workspace on the shared claim (or four times
# as long as a walk takes, for a workspace of very many files).
QUOTA_INTERVAL_S = 0.25


def api_client_for(cfg: KubernetesSandbox) -> client.ApiClient:
    """In-cluster credentials when running in a pod, else the kubeconfig (KUBECONFIG / ~/.kube/config)."""
    configuration = client.Configuration()
    try:
        if not cfg.kubeconfig and Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists():
            config.load_incluster_config(client_configuration=configuration)
        else:
            config.load_kube_config(
                config_file=cfg.kubeconfig or None, context=cfg.context or None, client_configuration=configuration, persist_config=False
            )
    except (config.ConfigException, OSError) as exc:
        raise ConfigError(
            "AGENTMESH_SANDBOX=kubernetes needs credentials for a cluster: run the tools service in a pod "
            f"with a service account, or point KUBECONFIG at a kubeconfig ({exc})"
        ) from None
    # urllib3 would otherwise retry on its own beneath ours; KubernetesJobs is the one retry layer.
    configuration.retries = 0
    return client.ApiClient(configuration)


class KubernetesExecutor:
    name = "kubernetes"

    def __init__(
        self,
        api: KubernetesJobs,
        cfg: KubernetesSandbox,
        limits: SandboxLimits,
        workspaces: Workspaces | None,
        tracer: trace.Tracer,
        metrics: SandboxMetrics | None = None,
        *,
        quota: WorkspaceQuota,
    ):
        self._api = api
        self._cfg = cfg
        self._limits = limits
        self._quota = quota
        self._meter = UsageMeter()
        self._workspaces = workspaces
        self._tracer = tracer
        self._metrics = metrics or NoMetrics()
        self._identity = pod_identity(cfg, os.getuid(), os.getgid())

    @property
    def api(self) -> KubernetesJobs:
        """The API adapter, shared with the MCP server pods (agentmesh.tools.mcp.pod_opener)."""
        return self._api

    @property
    def identity(self) -> tuple[int, int]:
        """The (uid, gid) sandbox pods run as."""
        return self._identity

    @classmethod
    def from_settings(
        cls, settings: ToolsSettings, workspaces: Workspaces | None, tracer: trace.Tracer, metrics: SandboxMetrics | None = None
    ) -> "KubernetesExecutor":
        cfg = settings.kubernetes
        api = KubernetesJobs(api_client_for(cfg), cfg.namespace, retries=cfg.api_retries)
        return cls(api, cfg, settings.limits, workspaces, tracer, metrics, quota=settings.workspace_quota)

    async def run(self, spec: CommandSpec) -> CommandResult:
        try:
            return await self._run(spec)
        except KubeApiError as exc:
            return self._api_failure(exc.status, exc.message)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            return self._api_failure(0, str(exc))

    def _api_failure(self, status: int, message: str) -> CommandResult:
        namespace = self._cfg.namespace
        if status in (401, 403):
            detail = (
                f"the Kubernetes API refused the tools service ({status}): {message}. Its service account needs "
                f"create/get/list/watch/delete on jobs and get/list/watch on pods and pods/log in namespace {namespace}"
            )
        elif status == 404:
            detail = f"the Kubernetes API answered 404: {message} (does namespace {namespace} exist?)"
        elif status:
            detail = f"the Kubernetes API failed ({status}): {message}"
        else:
            detail = f"the Kubernetes API could not be reached: {message}"
        return CommandResult(exit_code=-1, stdout="", stderr="", error_kind="sandbox_unavailable", detail=detail)

    async def _run(self, spec: CommandSpec) -> CommandResult:
        workspace: Path | None = None
        if self._cfg.workspace_pvc and self._workspaces is not None:
            # The tools service mounts the same claim: the session's directory exists (with the
            # sandbox's ownership) before the pod mounts it as its subPath.
            workspace = await asyncio.to_thread(self._workspaces.ensure, spec.session_id)
        # Growth past the quota is stopped, not being past it: a call that starts over it may delete.
        used_before = await self._meter.usage(workspace) if workspace is not None else 0
        name = job_name()
        with self._tracer.start_as_current_span(
            "sandbox.k8s_job",
            attributes={
                "agentmesh.sandbox.executor": "kubernetes",
                "agentmesh.sandbox.job": name,
                "agentmesh.sandbox.namespace": self._cfg.namespace,
                "agentmesh.session_id": spec.session_id,
                GEN_AI_TOOL_CALL_ID: spec.call_id,
                "agentmesh.sandbox.timeout_s": spec.timeout_s,
            },
        ) as span:
            started = time.monotonic()
            body = build_job(
                spec,
                self._cfg,
                name,
                traceparent_env().get("TRACEPARENT", ""),
                self._identity,
                quota_bytes=self._quota.limit_bytes,
                file_size_bytes=self._limits.file_size_bytes,
            )
            try:
                await self._api.create_job(body)
                verdict = await self._follow(name, spec, started, workspace, used_before)
                logs = await self._logs(verdict.pod)
            finally:
                await self._delete(name)
            result = self._result(verdict, logs, started)
            await name_pod_quota(result, result.stdout, workspace, used_before, self._meter, self._quota)
            span.set_attribute("agentmesh.sandbox.exit_code", result.exit_code)
            if result.error_kind:
                span.set_attribute("agentmesh.sandbox.error_kind", result.error_kind)
            return result

    async def _follow(self, name: str, spec: CommandSpec, started: float, workspace: Path | None, used_before: int) -> Verdict:
        tracker = JobTracker(name, spec.timeout_s, self._cfg.start_timeout_s, self._cfg.memory_limit, started)
        updates: asyncio.Queue = asyncio.Queue()
        watcher = asyncio.create_task(self._watch(name, updates))
        disk = asyncio.create_task(self._watch_disk(workspace, used_before, updates)) if workspace is not None else None
        try:
            while True:
                remaining = tracker.next_deadline() - time.monotonic()
                try:
                    kind, obj = await asyncio.wait_for(updates.get(), timeout=max(remaining, 0.01))
                except TimeoutError:
                    kind, obj = "tick", None
                if kind == "error":
                    raise obj
                now = time.monotonic()
                if kind == "pod":
                    verdict = tracker.on_pod(obj, now)
                elif kind == "disk_quota":
                    # The finally below deletes the Job, and with it the pod.
                    verdict = Verdict("disk_quota", self._quota.exceeded_detail(obj, stopped=True), -9, tracker.pod_name)
                elif kind == "job":
                    verdict = tracker.on_job(obj)
                else:
                    verdict = None
                verdict = verdict or tracker.on_tick(now)
                if verdict is not None:
                    if tracker.running_since is not None:
                        self._metrics.record_sandbox_wait(tracker.running_since - started, "kubernetes")
                    elif verdict.pod and not verdict.error_kind:
                        # Ran and ended between two looks: it waited at most this long.
                        self._metrics.record_sandbox_wait(now - started, "kubernetes")
                    return verdict
        finally:
            watcher.cancel()
            if disk is not None:
                disk.cancel()

    async def _watch_disk(self, workspace: Path, used_before: int, updates: asyncio.Queue) -> None:
        """Measure the session's directory on the shared claim until it grows past the quota."""
        interval = QUOTA_INTERVAL_S
        while True:
            await asyncio.sleep(interval)
            began = time.monotonic()
            try:
                usage = await self._meter.usage(workspace)
            except OSError:
                continue
            if self._quota.over(usage) and usage > used_before:
                updates.put_nowait(("disk_quota", usage))
                return
            interval = max(QUOTA_INTERVAL_S, 4 * (time.monotonic() - began))


    async def _watch(self, name: str, updates: asyncio.Queue) -> None:
        """Feed pod states (and the Job's, whenever a pod goes away or a watch ends) into `updates`."""
        selector = f"{LABEL_JOB}={name}"
        try:
            while True:
                pods, version = await self._api.list_pods(selector)
                for pod in pods:
                    updates.put_nowait(("pod", pod))
                if not pods:
                    updates.put_nowait(("job", await self._api.get_job(name)))
                async for event, pod in self._api.watch_pods(selector, version, WATCH_WINDOW_S):
                    if event in ("ADDED", "MODIFIED"):
                        updates.put_nowait(("pod", pod))
                    elif event == "DELETED":
                        updates.put_nowait(("job", await self._api.get_job(name)))
                updates.put_nowait(("job", await self._api.get_job(name)))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the follower reports it
            updates.put_nowait(("error", exc))

    async def _logs(self, pod: str) -> CappedOutput:
        output = CappedOutput(self._limits.output_cap_bytes)
        if not pod:
            return output
        try:
            text = await self._api.pod_log(pod, CONTAINER, limit_bytes=self._limits.output_cap_bytes * 4)
        except KubeApiError as exc:
            log.warning("could not read the sandbox pod's log", pod=pod, error=str(exc))
            return output
        output.feed(text.encode("utf-8"))
        return output

    async def _delete(self, name: str) -> None:
        # Shielded: a cancelled call must still remove its Job (and so its pod).
        deletion = asyncio.ensure_future(self._api.delete_job(name))
        try:
            await asyncio.shield(deletion)
        except asyncio.CancelledError:
            await asyncio.wait({deletion}, timeout=10)
            raise
        except Exception as exc:  # noqa: BLE001 - the TTL removes it later; say so
            log.warning("could not delete the sandbox Job; its TTL will", job=name, error=str(exc))

    def _result(self, verdict: Verdict, logs: CappedOutput, started: float) -> CommandResult:
        # A pod's log is stdout and stderr interleaved; it is reported as stdout.
        return CommandResult(
            exit_code=verdict.exit_code,
            stdout=logs.text(),
            stderr="",
            truncated=logs.truncated,
            duration_ms=(time.monotonic() - started) * 1000,
            error_kind=verdict.error_kind,
            detail=verdict.detail,
        )

    async def close(self) -> None:
        self._meter.close()
        await self._api.close()
