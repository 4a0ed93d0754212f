"""What a valid job is, and how its next due time follows from its schedule."""

from __future__ import annotations

from typing import Any, Mapping

from agentmesh.errors import InvalidArgument
from agentmesh.ids import validate_id
from agentmesh.modes import validate_mode
from agentmesh.scheduler.model import CONCURRENCY_POLICIES, IF_BUSY_POLICIES, MISSED_RUN_POLICIES, PLAN_MODES, Job
from agentmesh.scheduler.schedules import OnceSchedule, Schedule, StartupSchedule, load_timezone, parse_schedule

# Fields a client may set; the rest are the scheduler's own bookkeeping.
EDITABLE_FIELDS = (
    "name", "schedule", "prompt", "session_id", "mode", "enabled", "timezone",
    "concurrency_policy", "missed_run_policy", "if_busy", "plan", "run_at", "agent",
)
# Changing one of these moves the job onto a new timetable.
TIMETABLE_FIELDS = ("schedule", "timezone", "enabled", "run_at")

MAX_NAME_CHARS = 200
MAX_PROMPT_CHARS = 100_000  # the gateway's default message limit


def validate_job(job: Job) -> None:
    """Raise InvalidArgument naming the first thing wrong with `job`'s client-set fields."""
    if not job.name.strip():
        raise InvalidArgument("name is required: give the job a short name people recognise")
    if len(job.name) > MAX_NAME_CHARS:
        raise InvalidArgument(f"name is longer than {MAX_NAME_CHARS} characters")
    if not job.prompt.strip():
        raise InvalidArgument("prompt is empty: it is the message the agent receives on each run")
    if len(job.prompt) > MAX_PROMPT_CHARS:
        raise InvalidArgument(f"prompt is {len(job.prompt)} characters; the limit is {MAX_PROMPT_CHARS}")
    if job.session_id:
        validate_id(job.session_id, "session_id")
    # Checked here too, so a bad mode is refused when the job is saved, not each time it fires.
    validate_mode(job.mode, "mode")
    if job.if_busy not in IF_BUSY_POLICIES:
        raise InvalidArgument(f"if_busy {job.if_busy[:40]!r} is unknown; use one of {', '.join(IF_BUSY_POLICIES)} (or leave it empty)")
    if job.plan not in PLAN_MODES:
        raise InvalidArgument(f"plan {job.plan[:40]!r} is unknown; use auto, ask, or leave it empty for no plan mode")
    if job.concurrency_policy not in CONCURRENCY_POLICIES:
        raise InvalidArgument(
            f"concurrency_policy {job.concurrency_policy[:40]!r} is unknown; use one of {', '.join(CONCURRENCY_POLICIES)}"
        )
    if job.missed_run_policy not in MISSED_RUN_POLICIES:
        raise InvalidArgument(
            f"missed_run_policy {job.missed_run_policy[:40]!r} is unknown; use one of {', '.join(MISSED_RUN_POLICIES)}"
        )
    load_timezone(job.timezone)
    if job.run_at and job.schedule:
        raise InvalidArgument("give either a schedule (a recurring job) or run_at (a one-off job), not both")
    if not job.run_at:
        parse_schedule(job.schedule)


def schedule_of(job: Job) -> Schedule:
    """The job's timetable: its one-off time, or its parsed schedule."""
    return OnceSchedule(job.run_at) if job.run_at else parse_schedule(job.schedule)


def apply_defaults(job: Job) -> Job:
    job.timezone = job.timezone or "UTC"
    job.concurrency_policy = job.concurrency_policy or "forbid"
    job.missed_run_policy = job.missed_run_policy or "run_once"
    job.schedule = " ".join(job.schedule.split())
    return job


def apply_changes(job: Job, changes: Mapping[str, Any]) -> Job:
    unknown = [name for name in changes if name not in EDITABLE_FIELDS]
    if unknown:
        raise InvalidArgument(
            f"cannot update {', '.join(sorted(unknown))}: the editable fields are {', '.join(EDITABLE_FIELDS)}"
        )
    for name, value in changes.items():
        setattr(job, name, value)
    return apply_defaults(job)


def is_startup(job: Job) -> bool:
    return isinstance(schedule_of(job), StartupSchedule)


def next_due(job: Job, after: float) -> float:
    """The job's first due time strictly after `after`; 0 when disabled or never on the clock."""
    if not job.enabled:
        return 0.0
    due = schedule_of(job).next_after(after, load_timezone(job.timezone), job.anchor_at)
    return due or 0.0
