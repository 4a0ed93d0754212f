"""Executing runs: one asyncio task per run, its outcome recorded, cancellable with a reason."""

from __future__ import annotations

import asyncio
import contextlib

import structlog
from opentelemetry import trace

from agentmesh.logs import get_logger
from agentmesh.scheduler.model import Job, Run, RunOutcome, RunRequest
from agentmesh.scheduler.ports import Clock, RunTarget
from agentmesh.scheduler.settings import SchedulerSettings
from agentmesh.scheduler.store import SqliteStore
from agentmesh.telemetry import Telemetry

log = get_logger("agentmesh.scheduler.runs")


class RunExecutor:
    def __init__(self, store: SqliteStore, target: RunTarget, clock: Clock, settings: SchedulerSettings,
                 telemetry: Telemetry):
        self._store = store
        self._target = target
        self._clock = clock
        self._settings = settings
        self._tracer = telemetry.tracer
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._cancel_reasons: dict[str, str] = {}
        meter = telemetry.meter
        self._finished = meter.create_counter("agentmesh.scheduler.runs", description="Runs ended, by status")
        self._lateness = meter.create_histogram(
            "agentmesh.scheduler.fire_lateness", unit="s", description="How late a scheduled run started after its due time"
        )

    @property
    def active(self) -> int:
        return len(self._tasks)

    def launch(self, job: Job, run: Run) -> None:
        if run.trigger != "manual":
            self._lateness.record(max(0.0, run.started_at - run.scheduled_for), {"trigger": run.trigger})
        task = asyncio.create_task(self._execute(job, run), name=f"scheduler-run-{run.run_id}")
        self._tasks[run.run_id] = task
        task.add_done_callback(lambda _t: self._tasks.pop(run.run_id, None))

    async def _execute(self, job: Job, run: Run) -> None:
        attributes = {"agentmesh.job.id": job.job_id, "agentmesh.job.name": job.name,
                      "agentmesh.run.trigger": run.trigger, "agentmesh.run.id": run.run_id}
        with self._tracer.start_as_current_span(f"scheduled_run {job.name}", attributes=attributes) as span, \
                structlog.contextvars.bound_contextvars(session_id=run.session_id, job_id=job.job_id, run_id=run.run_id):
            log.info("run started", trigger=run.trigger, scheduled_for=run.scheduled_for)

            async def on_started(session_id: str, trace_id: str) -> None:
                run.session_id, run.trace_id = session_id or run.session_id, trace_id
                await self._store.mark_started(run.run_id, run.session_id, trace_id)

            request = RunRequest(run.session_id, job.prompt, job.mode, self._settings.run_timeout_s,
                                 principal=job.created_by, tenant=job.created_by_tenant, if_busy=job.if_busy,
                                 plan=job.plan, agent=job.agent)
            try:
                outcome = await self._target.run(request, on_started)
            except asyncio.CancelledError:
                reason = self._cancel_reasons.pop(run.run_id, "the run was cancelled")
                outcome = RunOutcome("cancelled", run.session_id, run.trace_id, "", reason)
            except Exception as exc:  # any failure is recorded, the schedule carries on
                log.exception("run crashed")
                outcome = RunOutcome("failed", run.session_id, run.trace_id, "", f"{type(exc).__name__}: {exc}")
            run.status = outcome.status
            run.session_id = outcome.session_id or run.session_id
            own = span.get_span_context()
            run.trace_id = outcome.trace_id or run.trace_id or (format(own.trace_id, "032x") if own.is_valid else "")
            run.summary, run.error = outcome.summary, outcome.error
            run.finished_at = self._clock.now()
            if outcome.status == "failed":
                span.set_status(trace.Status(trace.StatusCode.ERROR, outcome.error[:200]))
            # Shielded: a second cancel (shutdown) must not lose the record of this one.
            await asyncio.shield(self._store.finish_run(run, self._settings.history_limit))
            self._finished.add(1, {"status": run.status, "trigger": run.trigger})
            log.info("run ended", status=run.status, error=run.error or None)

    async def cancel(self, runs: list[Run], reason: str) -> None:
        """Stop `runs`: our own tasks directly, other instances' through the gateway."""
        waits = []
        for run in runs:
            task = self._tasks.get(run.run_id)
            if task is not None:
                self._cancel_reasons[run.run_id] = reason
                task.cancel()
                waits.append(task)
            elif run.session_id:
                await self._target.cancel(run.session_id)
        for task in waits:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def drain(self, grace_s: float, reason: str) -> None:
        """Let running runs finish for `grace_s`, then cancel what is left."""
        pending = list(self._tasks.values())
        if pending and grace_s > 0:
            await asyncio.wait(pending, timeout=grace_s)
        left = [t for t in self._tasks.values() if not t.done()]
        for run_id, task in list(self._tasks.items()):
            self._cancel_reasons[run_id] = reason
            task.cancel()
        for task in left:
            with contextlib.suppress(asyncio.CancelledError):
                await task
