"""The scheduler core: the job API, leadership, and the firing loop. No gRPC in here.

Two loops run per instance:
- the leader loop, every `renew_s`: take or keep leadership, record liveness, and (as leader)
  fail runs orphaned by a crashed instance; becoming leader fires the `startup` jobs;
- the firing loop, as leader: sleep until the earliest due job (at most `poll_s`, or until a
  local edit wakes it), then claim and start every due run.

A due run is claimed in the store before it starts (see SqliteStore.claim), so however
leadership moves, each (job, due time) fires once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from datetime import UTC
from typing import Any, Mapping

from agentmesh.errors import FailedPrecondition, InvalidArgument, NotFound
from agentmesh.ids import new_id, validate_id
from agentmesh.logs import get_logger
from agentmesh.scheduler.jobs import (
    TIMETABLE_FIELDS,
    apply_changes,
    apply_defaults,
    is_startup,
    next_due,
    schedule_of,
    validate_job,
)
from agentmesh.scheduler.model import Job, Run
from agentmesh.scheduler.ports import Clock, LeaderLock, RunTarget
from agentmesh.scheduler.runs import RunExecutor
from agentmesh.scheduler.schedules import check_run_at, load_timezone
from agentmesh.scheduler.settings import SchedulerSettings
from agentmesh.scheduler.store import Claim, SqliteStore
from agentmesh.telemetry import Telemetry

log = get_logger("agentmesh.scheduler")

MAX_RUNS_PAGE = 500
DEFAULT_RUNS_PAGE = 20
_DUE_BATCH = 500


class Scheduler:
    def __init__(self, store: SqliteStore, target: RunTarget, lock: LeaderLock, clock: Clock,
                 settings: SchedulerSettings, telemetry: Telemetry, instance_id: str):
        self._store = store
        self._lock = lock
        self._clock = clock
        self._settings = settings
        self.instance_id = instance_id
        self._runs = RunExecutor(store, target, clock, settings, telemetry)
        self._is_leader = False
        self._leader_event = asyncio.Event()
        self._changed = asyncio.Event()
        self._stopping = asyncio.Event()
        self._loops: list[asyncio.Task[None]] = []

    # --- lifecycle ------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self._is_leader

    @property
    def active_runs(self) -> int:
        """Runs this instance is executing now."""
        return self._runs.active

    async def start(self) -> None:
        await self._store.heartbeat(self.instance_id, self._clock.now())
        self._loops = [
            asyncio.create_task(self._leader_loop(), name="scheduler-leader"),
            asyncio.create_task(self._fire_loop(), name="scheduler-fire"),
        ]

    async def stop(self, grace_s: float) -> None:
        """Stop firing, let runs finish for `grace_s`, cancel the rest, hand leadership back."""
        self._stopping.set()
        for task in self._loops:
            task.cancel()
        for task in self._loops:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._runs.drain(grace_s, "the scheduler stopped before the run finished")
        self._is_leader = False
        await self._lock.release()
        await self._store.forget_instance(self.instance_id)

    # --- the job API ----------------------------------------------------------------------

    async def create_job(self, job: Job) -> Job:
        job = apply_defaults(dataclasses.replace(job))
        job.job_id = validate_id(job.job_id, "job_id") if job.job_id else new_id("job")
        validate_job(job)
        now = self._clock.now()
        if job.run_at:
            check_run_at(job.run_at, now)
        job.created_at = job.updated_at = job.anchor_at = now
        job.last_run_at = job.done_at = 0.0
        job.next_run_at = next_due(job, now)
        await self._store.create_job(job)
        self._changed.set()
        log.info("job created", job_id=job.job_id, schedule=job.schedule)
        return job

    async def get_job(self, job_id: str) -> Job:
        validate_id(job_id, "job_id")
        job = await self._store.get_job(job_id)
        if job is None:
            raise NotFound(f"no job with id {job_id!r}; `agentmesh cron list` shows the jobs")
        return job

    async def list_jobs(self) -> list[Job]:
        return await self._store.list_jobs()

    async def update_job(self, job_id: str, changes: Mapping[str, Any]) -> Job:
        current = await self.get_job(job_id)
        job = apply_changes(dataclasses.replace(current), changes)
        validate_job(job)
        now = self._clock.now()
        if job.run_at != current.run_at:
            if job.run_at:
                check_run_at(job.run_at, now)  # only a time being set must lie ahead; a kept one may be past
            job.done_at = 0.0  # a new one-off time re-arms a done job
        job.updated_at = now
        retimed = any(getattr(job, f) != getattr(current, f) for f in TIMETABLE_FIELDS)
        if job.schedule != current.schedule or job.timezone != current.timezone:
            job.anchor_at = now  # a new interval counts from the edit
        if retimed:
            job.next_run_at = next_due(job, now)
        await self._store.put_job(job, retimed)
        self._changed.set()
        return await self.get_job(job_id)

    async def toggle_job(self, job_id: str) -> Job:
        job = await self.get_job(job_id)
        return await self.update_job(job_id, {"enabled": not job.enabled})

    async def delete_job(self, job_id: str) -> bool:
        validate_id(job_id, "job_id")
        job = await self._store.get_job(job_id)
        if job is None:
            return False
        await self._runs.cancel(await self._store.running_runs(job_id), "the job was deleted")
        deleted = await self._store.delete_job(job_id)
        self._changed.set()
        return deleted

    async def trigger_job(self, job_id: str) -> Run:
        """Start a run now, whatever the schedule says; the concurrency policy still applies."""
        job = await self.get_job(job_id)
        now = self._clock.now()
        running = await self._store.running_runs(job_id)
        if running and job.concurrency_policy == "forbid":
            raise FailedPrecondition(
                f"job {job_id!r} is still running (run {running[0].run_id}) and its concurrency policy is forbid; "
                "wait for it to finish, or set the policy to replace or allow"
            )
        run = self._new_run(job, now, now, "manual")
        await self._store.insert_run(run, last_run_at=now)
        if running and job.concurrency_policy == "replace":
            await self._runs.cancel(running, f"replaced by run {run.run_id} (concurrency policy replace)")
        self._runs.launch(job, run)
        return run

    async def list_runs(self, job_id: str, limit: int) -> list[Run]:
        if limit < 0 or limit > MAX_RUNS_PAGE:
            raise InvalidArgument(f"limit must be between 1 and {MAX_RUNS_PAGE} (0 means {DEFAULT_RUNS_PAGE})")
        if job_id:
            await self.get_job(job_id)
        return await self._store.list_runs(job_id, limit or DEFAULT_RUNS_PAGE)

    # --- leadership -----------------------------------------------------------------------

    async def _leader_loop(self) -> None:
        while not self._stopping.is_set():
            now = self._clock.now()
            try:
                await self._lead_once(now)
            except Exception:  # a bad round must not end leadership for good
                log.exception("leadership round failed")
            await self._wait(now + self._settings.renew_s)

    async def _lead_once(self, now: float) -> None:
        leader = await self._lock.acquire(now)
        await self._store.heartbeat(self.instance_id, now)
        if leader and not self._is_leader:
            log.info("became the active scheduler", instance=self.instance_id)
            self._is_leader = True
            self._leader_event.set()
            await self._fire_startup_jobs(now)
        elif not leader and self._is_leader:
            log.warning("lost leadership; firing paused", instance=self.instance_id)
            self._is_leader = False
            self._leader_event.clear()
        if leader:
            stale_before = now - max(3 * self._settings.renew_s, self._settings.lease_duration_s)
            orphaned = await self._store.fail_orphaned_runs(self.instance_id, now, stale_before)
            if orphaned:
                log.warning("runs of a stopped instance marked failed", count=orphaned)

    async def _fire_startup_jobs(self, now: float) -> None:
        jobs = [job for job in await self._store.list_jobs() if job.enabled and is_startup(job)]
        running = await self._store.running_by_job([job.job_id for job in jobs])
        plans = [self._plan(job, running.get(job.job_id, []), now, expected_next=0.0, new_next=0.0,
                            scheduled_for=now, trigger="startup") for job in jobs]
        await self._carry_out(plans)

    # --- firing ---------------------------------------------------------------------------

    async def _wait(self, deadline: float, *events: asyncio.Event) -> None:
        """Sleep on the clock until `deadline`, or until one of `events` (or stop) is set."""
        waiters = [asyncio.ensure_future(self._clock.sleep_until(deadline)),
                   *(asyncio.ensure_future(e.wait()) for e in (*events, self._stopping))]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    async def _fire_loop(self) -> None:
        while not self._stopping.is_set():
            if not self._is_leader:
                await self._leader_event.wait()
                continue
            self._changed.clear()
            now = self._clock.now()
            try:
                batch = await self.fire_due(now)
            except Exception:  # keep the timetable going whatever one pass did
                log.exception("firing pass failed")
                batch = 0
            if batch >= _DUE_BATCH:
                continue  # more are due right now
            earliest = await self._store.next_due_at()
            deadline = now + self._settings.poll_s
            if earliest is not None:
                deadline = min(deadline, earliest)
            await self._wait(deadline, self._changed)

    async def fire_due(self, now: float) -> int:
        """Claim and start every run due at `now`, in one store transaction; returns how many
        jobs were due."""
        due = await self._store.due_jobs(now, _DUE_BATCH)
        if not due or not self._is_leader:
            return len(due)
        running = await self._store.running_by_job([job.job_id for job in due])
        plans = []
        for job in due:
            try:
                plans.append(self._plan_due(job, running.get(job.job_id, []), now))
            except Exception as exc:  # one broken job must not stall the others
                log.exception("cannot evaluate a job's schedule; it is parked", job_id=job.job_id)
                note = f"the job's schedule could not be evaluated ({type(exc).__name__}: {exc}); fix and re-enable it"
                run = self._new_run(job, job.next_run_at, now, "schedule", status="failed", error=note)
                plans.append(_Plan(job, Claim(job.job_id, job.next_run_at, 0.0, run, ran=False)))
        await self._carry_out(plans)
        return len(due)

    def _plan_due(self, job: Job, running: list[Run], now: float) -> "_Plan":
        """What to do about a job whose due time has come: run it, catch up, or skip."""
        schedule, tz = schedule_of(job), load_timezone(job.timezone)
        due = job.next_run_at
        new_next = schedule.next_after(now, tz, job.anchor_at) or 0.0
        latest = schedule.latest_at_or_before(now, tz, job.anchor_at) or due
        # Missed: more than one due time went by, or this one is later than the grace allows.
        missed = latest > due or now - due > self._settings.misfire_grace_s
        if not missed:
            plan = self._plan(job, running, now, expected_next=due, new_next=new_next, scheduled_for=due,
                              trigger="schedule")
        elif job.missed_run_policy == "skip":
            note = f"missed while no scheduler was running (due {_iso(due)}, now {_iso(now)}); missed-run policy skip"
            run = self._new_run(job, latest, now, "catch_up", status="skipped", error=note)
            plan = _Plan(job, Claim(job.job_id, due, new_next, run, ran=False))
        else:
            plan = self._plan(job, running, now, expected_next=due, new_next=new_next, scheduled_for=latest,
                              trigger="catch_up")
        if job.run_at:
            # A one-off has one due time: whatever became of it (run, caught up, skipped) is
            # recorded in the same transaction that marks the job done, so it never fires again.
            plan.claim = dataclasses.replace(plan.claim, done=True)
        return plan

    def _plan(self, job: Job, running: list[Run], now: float, *, expected_next: float, new_next: float,
              scheduled_for: float, trigger: str) -> "_Plan":
        """A run for `job`, as its concurrency policy allows given the runs still going."""
        if running and job.concurrency_policy == "forbid":
            note = f"the previous run {running[0].run_id} was still going; concurrency policy forbid"
            run = self._new_run(job, scheduled_for, now, trigger, status="skipped", error=note)
            return _Plan(job, Claim(job.job_id, expected_next, new_next, run, ran=False))
        run = self._new_run(job, scheduled_for, now, trigger)
        replace = running if job.concurrency_policy == "replace" else []
        return _Plan(job, Claim(job.job_id, expected_next, new_next, run), replace)

    async def _carry_out(self, plans: list["_Plan"]) -> None:
        claimed = await self._store.claim_many([plan.claim for plan in plans])
        for plan, won in zip(plans, claimed, strict=True):
            run = plan.claim.run
            if not won:
                continue  # another instance fired this due time
            if run.status != "running":
                log.info("run not started", job_id=plan.job.job_id, status=run.status, reason=run.error)
                continue
            if plan.replace:
                await self._runs.cancel(plan.replace, f"replaced by run {run.run_id} (concurrency policy replace)")
            self._runs.launch(plan.job, run)

    def _new_run(self, job: Job, scheduled_for: float, now: float, trigger: str, *, status: str = "running",
                 error: str = "") -> Run:
        run_id = new_id("run")
        # The gateway needs a session id; a fresh-session job gets one per run, named after the job.
        session_id = job.session_id or f"{job.job_id}-{run_id.removeprefix('run-')}"
        return Run(run_id=run_id, job_id=job.job_id, status=status, scheduled_for=scheduled_for, started_at=now,
                   finished_at=now if status != "running" else 0.0, session_id=session_id if status == "running" else "",
                   error=error, trigger=trigger, owner=self.instance_id)


@dataclasses.dataclass
class _Plan:
    job: Job
    claim: Claim
    replace: list[Run] = dataclasses.field(default_factory=list)  # runs to cancel once claimed


def _iso(ts: float) -> str:
    from datetime import datetime

    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
