"""gRPC adapter of the scheduler: proto <-> core types, and `build()` wiring core and adapters."""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from pathlib import Path

from agentmesh.clients.gateway import GatewayClient
from agentmesh.config import Settings
from agentmesh.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied
from agentmesh.rpc.audit import AuditLog
from agentmesh.rpc.auth import current_principal, scope_of_call
from agentmesh.rpc.client import open_channel
from agentmesh.rpc.errors import translate_errors
from agentmesh.rpc.identity import ServiceIdentity
from agentmesh.rpc.server import MIB, ServiceHost
from agentmesh.scheduler.agent_controller import AgentController, run_controller_while_leading
from agentmesh.scheduler.agent_resources import (
    GatewayAgentDefinitions,
    KubeAgentResources,
    kubernetes_custom_objects_api,
)
from agentmesh.scheduler.clock import SystemClock
from agentmesh.scheduler.engine import Scheduler
from agentmesh.scheduler.gateway_target import GatewayRunTarget
from agentmesh.scheduler.idle_reflection import (
    GatewaySessions,
    IdleReflections,
    IdleSettings,
    ReflectionClaims,
    run_while_leading,
)
from agentmesh.scheduler.jobs import EDITABLE_FIELDS
from agentmesh.scheduler.jobs_file import JobsFileWatcher
from agentmesh.scheduler.leader import FileLeaderLock, LeaseLeaderLock, kubernetes_lease_api
from agentmesh.scheduler.model import Job, Run
from agentmesh.scheduler.model_resources import PLURAL as MODEL_PLURAL
from agentmesh.scheduler.model_resources import GatewayNamespaceModels, reconcile_models
from agentmesh.scheduler.ports import Clock, LeaderLock
from agentmesh.scheduler.retention_sweep import RetentionSweeps
from agentmesh.scheduler.settings import SchedulerSettings
from agentmesh.scheduler.store import SqliteStore
from agentmesh.scheduler.wakeups import schedule_wakeup
from agentmesh.telemetry import Telemetry
from agentmesh.tenancy import decode_memberships, encode_memberships, required_role, role_at_least
from agentmesh.v1 import scheduler_pb2, scheduler_pb2_grpc


def job_to_proto(job: Job) -> scheduler_pb2.Job:
    return scheduler_pb2.Job(
        job_id=job.job_id, name=job.name, schedule=job.schedule, prompt=job.prompt, session_id=job.session_id,
        mode=job.mode, enabled=job.enabled, timezone=job.timezone, concurrency_policy=job.concurrency_policy,
        missed_run_policy=job.missed_run_policy, created_at=job.created_at, updated_at=job.updated_at,
        next_run_at=job.next_run_at, last_run_at=job.last_run_at, if_busy=job.if_busy, plan=job.plan,
        run_at=job.run_at, done_at=job.done_at, source=job.source, agent=job.agent,
    )


def run_to_proto(run: Run) -> scheduler_pb2.JobRun:
    return scheduler_pb2.JobRun(
        run_id=run.run_id, job_id=run.job_id, status=run.status, scheduled_for=run.scheduled_for,
        started_at=run.started_at, finished_at=run.finished_at, session_id=run.session_id, trace_id=run.trace_id,
        summary=run.summary, error=run.error, trigger=run.trigger,
    )


def job_from_proto(message: scheduler_pb2.Job) -> Job:
    return Job(
        job_id=message.job_id, name=message.name, schedule=message.schedule, prompt=message.prompt,
        session_id=message.session_id, mode=message.mode, timezone=message.timezone,
        enabled=message.enabled if message.HasField("enabled") else True,
        concurrency_policy=message.concurrency_policy, missed_run_policy=message.missed_run_policy,
        if_busy=message.if_busy, plan=message.plan, run_at=message.run_at, source=message.source,
        agent=message.agent,
    )


def changes_from_update(request: scheduler_pb2.UpdateJobRequest) -> dict:
    """The fields an UpdateJob applies: those in update_mask, else every field set to a non-default value."""
    mask = list(request.update_mask)
    unknown = [name for name in mask if name not in EDITABLE_FIELDS]
    if unknown:
        raise InvalidArgument(
            f"update_mask names {', '.join(sorted(unknown))}, which cannot be updated; "
            f"use any of {', '.join(EDITABLE_FIELDS)}"
        )
    names = mask or [f.name for f, _ in request.job.ListFields() if f.name in EDITABLE_FIELDS]
    return {name: getattr(request.job, name) for name in names}


def job_tenant(job: Job) -> str:
    """The tenant a job belongs to: the one its creator made it in (see CreateJob)."""
    return next(iter(decode_memberships(job.created_by_tenant)), "")


def _declared_in_file(job: Job, watched: JobsFileWatcher | None) -> None:
    """The watched jobs file owns its jobs: an edit through the API would be undone by the next
    reconcile. Jobs of a file no longer watched (the setting changed) are anyone's to clean up."""
    if watched is not None and job.source == watched.source:
        raise FailedPrecondition(
            f"job {job.job_id!r} is declared in the jobs file {job.source.removeprefix('file:')}; "
            "change or remove it there (running it now with `cron run` is allowed)"
        )


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self, core: Scheduler, audit: AuditLog | None = None, jobs_file: JobsFileWatcher | None = None):
        self._core = core
        self._audit = audit
        self._jobs_file = jobs_file

    def _record(self, action: str, job_id: str, outcome: str = "allowed", **fields) -> None:
        if self._audit is not None:
            self._audit.record(action, outcome, current_principal.get(), job_id=job_id, **fields)

    async def _job(self, job_id: str, rpc: str) -> Job:
        """The job, if the caller holds the rpc's role in its tenant; another tenant's is NOT_FOUND."""
        return await self._visible(await self._core.get_job(job_id), job_id, rpc)

    async def _visible(self, job: Job, job_id: str, rpc: str) -> Job:
        scope = scope_of_call()
        if scope.unrestricted:
            return job
        tenant = job_tenant(job)
        have = (scope.memberships or {}).get(tenant)
        needed = required_role(rpc)
        if have is None:
            self._record("cross_tenant", job_id, "refused", method=f"scheduler.{rpc}")
            raise NotFound(f"job {job_id!r} does not exist")
        if not role_at_least(have, needed):
            raise PermissionDenied(f"this needs the {needed} role in tenant {tenant!r}; you are {have} there")
        return job

    @translate_errors
    async def CreateJob(self, request, context):
        job = job_from_proto(request.job)
        if job.source and not (job.source.startswith("apply:") and len(job.source) <= 300):
            raise InvalidArgument(
                f"source {job.source[:60]!r} cannot be set: leave it empty, or 'apply:<name>' for jobs of "
                "`agentmesh cron apply` (file: jobs belong to the scheduler's jobs file)"
            )
        # Runs are made on behalf of whoever created the job (agentmesh.rpc.auth set it), in
        # the tenant it was made in: its runs see that tenant only, at the creator's role there.
        if (principal := current_principal.get()) is not None:
            scope = scope_of_call()
            tenants = principal.tenant
            if not scope.unrestricted:
                tenant = scope.home_tenant(required_role("CreateJob"))
                tenants = encode_memberships({tenant: (scope.memberships or {})[tenant]})
            job.created_by, job.created_by_tenant = principal.subject, tenants
        created = await self._core.create_job(job)
        self._record("cron.create", created.job_id, name=created.name, schedule=created.schedule,
                     tenant=job_tenant(created))
        return job_to_proto(created)

    @translate_errors
    async def UpdateJob(self, request, context):
        _declared_in_file(await self._job(request.job.job_id, "UpdateJob"), self._jobs_file)
        changes = changes_from_update(request)
        updated = await self._core.update_job(request.job.job_id, changes)
        self._record("cron.update", updated.job_id, fields=",".join(sorted(changes)))
        return job_to_proto(updated)

    @translate_errors
    async def DeleteJob(self, request, context):
        try:
            job = await self._core.get_job(request.job_id)
        except NotFound:
            job = None  # deleting what is not there answers deleted=false, as before
        if job is not None:
            _declared_in_file(await self._visible(job, request.job_id, "DeleteJob"), self._jobs_file)
        deleted = await self._core.delete_job(request.job_id)
        self._record("cron.delete", request.job_id)
        return scheduler_pb2.DeleteJobResponse(deleted=deleted)

    @translate_errors
    async def GetJob(self, request, context):
        return job_to_proto(await self._job(request.job_id, "GetJob"))

    @translate_errors
    async def ListJobs(self, request, context):
        scope = scope_of_call()
        jobs = [j for j in await self._core.list_jobs()
                if scope.unrestricted or job_tenant(j) in (scope.memberships or {})]
        response = scheduler_pb2.ListJobsResponse(jobs=[job_to_proto(j) for j in jobs])
        if self._jobs_file is not None:
            status = self._jobs_file.status
            response.jobs_file.CopyFrom(scheduler_pb2.JobsFileStatus(
                path=status.path, ok=status.ok, error=status.error, checked_at=status.checked_at,
                applied_at=status.applied_at, jobs=status.jobs))
        return response

    @translate_errors
    async def ToggleJob(self, request, context):
        _declared_in_file(await self._job(request.job_id, "ToggleJob"), self._jobs_file)
        toggled = await self._core.toggle_job(request.job_id)
        self._record("cron.toggle", toggled.job_id, enabled=toggled.enabled)
        return job_to_proto(toggled)

    @translate_errors
    async def TriggerJob(self, request, context):
        await self._job(request.job_id, "TriggerJob")
        self._record("cron.trigger", request.job_id)
        return run_to_proto(await self._core.trigger_job(request.job_id))

    @translate_errors
    async def ScheduleWakeup(self, request, context):
        # Made on behalf of the user whose turn asked for it, in their tenant, as CreateJob does.
        created_by, tenants = "", ""
        if (principal := current_principal.get()) is not None:
            scope = scope_of_call()
            created_by, tenants = principal.subject, principal.tenant
            if not scope.unrestricted:
                tenant = scope.home_tenant(required_role("ScheduleWakeup"))
                tenants = encode_memberships({tenant: (scope.memberships or {})[tenant]})
        job = await schedule_wakeup(self._core, request.session_id, request.run_at, request.note, created_by, tenants)
        self._record("cron.wakeup", job.job_id, session_id=job.session_id, tenant=job_tenant(job))
        return job_to_proto(job)

    @translate_errors
    async def CancelWakeup(self, request, context):
        job = await self._job(request.job_id, "CancelWakeup")  # a member of its tenant
        if not job.source.startswith("wakeup:"):
            raise FailedPrecondition(f"job {request.job_id!r} is not a wake-up; delete it with `agentmesh cron delete` "
                                     "(an admin's)")
        deleted = await self._core.delete_job(request.job_id)
        self._record("cron.wakeup_cancel", request.job_id)
        return scheduler_pb2.DeleteJobResponse(deleted=deleted)

    @translate_errors
    async def ListRuns(self, request, context):
        if request.job_id:
            await self._job(request.job_id, "ListRuns")
        runs = await self._core.list_runs(request.job_id, request.limit)
        scope = scope_of_call()
        if not request.job_id and not scope.unrestricted:
            mine = {j.job_id for j in await self._core.list_jobs() if job_tenant(j) in (scope.memberships or {})}
            runs = [r for r in runs if r.job_id in mine]
        return scheduler_pb2.ListRunsResponse(runs=[run_to_proto(r) for r in runs])


def _instance_id() -> str:
    # Pod name (the hostname in Kubernetes) makes the Lease holder readable in `kubectl get lease`.
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def _leader_lock(config: SchedulerSettings, settings: Settings, identity: str) -> LeaderLock:
    if config.lock == "lease":
        return LeaseLeaderLock(kubernetes_lease_api(), config.namespace, config.lease_name, identity,
                               config.lease_duration_s)
    return FileLeaderLock(settings.home / "scheduler" / "leader.lock")


async def build(settings: Settings, telemetry: Telemetry, address: str | None = None, *,
                clock: Clock | None = None, lock: LeaderLock | None = None) -> ServiceHost:
    """The scheduler host; `clock` and `lock` are injectable (tests drive a fake clock)."""
    config = settings.section(SchedulerSettings)
    identity = _instance_id()
    lock = lock or _leader_lock(config, settings, identity)  # first: the one part that can refuse to start
    store = SqliteStore(settings.home / "scheduler" / "scheduler.db", config.journal_mode, config.max_jobs)
    service_identity = ServiceIdentity.open("scheduler", settings.keys_dir)
    # Runs reach the gateway under the scheduler's own identity, not a user's token.
    # One channel and one client to the gateway: the jobs' runs and idle reflection.
    gateway = GatewayClient(open_channel(settings.address_of("gateway"), telemetry, identity=service_identity,
                                         audience="gateway"), settings.address_of("gateway"))
    target = GatewayRunTarget(gateway)
    core = Scheduler(store, target, lock, clock or SystemClock(), config, telemetry, identity)
    host = ServiceHost("scheduler", settings, telemetry, address=address, identity=service_identity,
                       max_receive_bytes=MIB)
    now = (clock or SystemClock()).now
    jobs_file = JobsFileWatcher(core, Path(config.jobs_file), now) if config.jobs_file else None
    host.add(scheduler_pb2_grpc.add_SchedulerServicer_to_server, SchedulerServicer(core, host.audit, jobs_file),
             "agentmesh.v1.Scheduler")
    host.scheduler = core  # type: ignore[attr-defined]  # tests and benches look at leadership

    # Idle reflection: the leader's sweep, beside the jobs, on its own claims table.
    claims = ReflectionClaims(settings.home / "scheduler" / "reflections.db")
    sweeper = IdleReflections(claims, GatewaySessions(gateway),
                              IdleSettings(idle_s=config.reflect_idle_s, check_s=config.reflect_check_s,
                                           retry_s=config.reflect_retry_s))
    stopping = asyncio.Event()
    sweep_loop = None
    if config.reflect_idle_s > 0:
        sweep_loop = asyncio.create_task(
            run_while_leading(sweeper, lambda: core.is_leader, now, config.reflect_check_s, stopping),
            name="idle-reflection")

    retention_loop = None
    if config.retention_sweep_s > 0:
        sweeps = RetentionSweeps(gateway, config.retention_passes, timeout_s=600.0)
        retention_loop = asyncio.create_task(
            run_while_leading(sweeps, lambda: core.is_leader, now, config.retention_sweep_s, stopping),
            name="retention-sweep")

    # Agent resources (docs/agents.md): the leader syncs them into the managed namespaces' agents.
    agents_loop = models_loop = None
    if settings.managed_agent_namespaces:
        owner_of = settings.auth_policy.owner_of if settings.auth_policy.enforced else None
        custom_objects = kubernetes_custom_objects_api()
        controller = AgentController(KubeAgentResources(custom_objects), GatewayAgentDefinitions(gateway, owner_of),
                                     settings.managed_agent_namespaces, config.agent_resync_s)
        agents_loop = asyncio.create_task(
            run_controller_while_leading(controller, lambda: core.is_leader, config.renew_s, stopping),
            name="agent-resources")
        # ModelConfig resources become the namespaces' own models; an Agent naming one is
        # checked again (relisted) whenever they change.
        model_controller = AgentController(
            KubeAgentResources(custom_objects, MODEL_PLURAL),
            GatewayNamespaceModels(gateway, owner_of, on_change=controller.resync),
            settings.managed_agent_namespaces, config.agent_resync_s, reconcile=reconcile_models, kind="modelconfig")
        models_loop = asyncio.create_task(
            run_controller_while_leading(model_controller, lambda: core.is_leader, config.renew_s, stopping),
            name="modelconfig-resources")

    file_loop = None
    if jobs_file is not None:
        file_loop = asyncio.create_task(jobs_file.run(config.jobs_file_poll_s, stopping), name="jobs-file")

    async def shutdown() -> None:
        stopping.set()
        loops = [loop for loop in (sweep_loop, retention_loop, file_loop, agents_loop, models_loop) if loop is not None]
        if loops:
            await asyncio.wait(loops, timeout=settings.drain_s)
        await core.stop(settings.drain_s)
        await target.close()
        await claims.close()
        await store.close()

    host.on_stop(shutdown)
    # Firing starts now: the loops only talk to the store and the gateway, not to this host.
    await core.start()
    return host


__all__ = ["SchedulerServicer", "build", "job_to_proto", "run_to_proto"]
