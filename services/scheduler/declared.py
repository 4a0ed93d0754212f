"""Jobs declared in a file (the `cron.json` shape), and the reconcile that makes the scheduler
hold exactly those jobs. Pure: no I/O, no gRPC, so the scheduler's file watcher and
`agentmesh cron apply` (which reconciles through the API) share one reading and one diff.

A document is a JSON or YAML list of jobs, or {"jobs": [...]}. Each job:
  name (required; the key the reconcile matches on, unique in the file)
  schedule | cron   a schedule as the API takes it ("*/5 * * * *", "every 10m", ...), or
  at                an ISO 8601 time for a one-off job ("2026-12-01T09:00Z")
  message | prompt, session | session_id, mode, enabled, timezone | tz,
  concurrency_policy, missed_run_policy, if_busy, plan, agent (a named agent, "NAME" or "NAME@VERSION")
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

import yaml  # type: ignore[import-untyped]  # PyYAML ships no type hints

from agentmesh.errors import InvalidArgument
from agentmesh.scheduler.jobs import EDITABLE_FIELDS, apply_defaults, validate_job
from agentmesh.scheduler.model import Job
from agentmesh.scheduler.schedules import check_run_at, parse_time

MAX_FILE_BYTES = 1024 * 1024
_TEXT_KEYS = {  # field: the keys a file may spell it with, first wins
    "schedule": ("schedule", "cron"), "prompt": ("message", "prompt"), "session_id": ("session", "session_id"),
    "mode": ("mode",), "timezone": ("timezone", "tz"), "concurrency_policy": ("concurrency_policy",),
    "missed_run_policy": ("missed_run_policy",), "if_busy": ("if_busy",), "plan": ("plan",),
    "agent": ("agent",),
}
# Bookkeeping that single-process servers write into their cron.json: accepted and ignored, so
# their files load as they are. Any other unknown key is refused (a typo must not go unnoticed).
_IGNORED_KEYS = {"id", "description", "created_at", "updated_at", "last_run_at", "next_run_at", "last_status"}
_KNOWN_KEYS = {"name", "at", "enabled"} | {k for keys in _TEXT_KEYS.values() for k in keys} | _IGNORED_KEYS


@dataclasses.dataclass
class ReconcilePlan:
    added: list[Job] = dataclasses.field(default_factory=list)
    changed: list[tuple[Job, dict[str, Any]]] = dataclasses.field(default_factory=list)  # current job, changes
    removed: list[Job] = dataclasses.field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.added or self.changed or self.removed)

    def summary(self) -> str:
        return f"{len(self.added)} added, {len(self.changed)} changed, {len(self.removed)} removed"


def read_document(text: str, filename: str) -> list[Any]:
    """The list of job entries in a jobs file's text; YAML for .yaml/.yml, else JSON."""
    if len(text.encode()) > MAX_FILE_BYTES:
        raise InvalidArgument(f"{filename} is larger than {MAX_FILE_BYTES // 1024} KiB")
    try:
        data = yaml.safe_load(text) if filename.endswith((".yaml", ".yml")) else json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"{filename} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise InvalidArgument(f"{filename} is not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
    if isinstance(data, dict) and "jobs" in data:  # {"version": 1, "jobs": [...]} as some servers write it
        data = data["jobs"]
    if data is None:  # an empty YAML file (or a ConfigMap rendered from `jobs: []` as null)
        data = []
    if not isinstance(data, list):
        raise InvalidArgument(f'{filename}: expected a list of jobs, or an object {{"jobs": [...]}}')
    return data


def job_id_for(source: str, name: str) -> str:
    """A declared job's id follows from its source and name, so two instances reconciling the
    same file at once (a leader handover) create it once: the second create is ALREADY_EXISTS."""
    return "job-" + hashlib.sha256(f"{source}\0{name}".encode()).hexdigest()[:20]


def declared_jobs(entries: list[Any], source: str) -> list[Job]:
    """Every entry as a valid Job of `source`, or InvalidArgument naming the first bad entry."""
    jobs: list[Job] = []
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        job = _job(index, entry, source)
        if job.name in seen:
            raise InvalidArgument(f"job {index + 1}: the name {job.name!r} is used twice; names identify jobs in a file")
        seen.add(job.name)
        jobs.append(job)
    return jobs


def _job(index: int, entry: Any, source: str) -> Job:
    where = f"job {index + 1}"
    if not isinstance(entry, dict):
        raise InvalidArgument(f"{where}: expected an object with name, schedule (or at) and message")
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip():
        raise InvalidArgument(f"{where}: name is required (a string); it identifies the job in this file")
    where = f"job {index + 1} ({name[:60]!r})"
    unknown = sorted(str(k) for k in entry if k not in _KNOWN_KEYS)
    if unknown:
        raise InvalidArgument(f"{where}: unknown key {unknown[0]!r}; known keys are {', '.join(sorted(_KNOWN_KEYS))}")
    values: dict[str, Any] = {}
    for field, keys in _TEXT_KEYS.items():
        for key in keys:
            value = entry.get(key)
            if value is None:
                continue
            if not isinstance(value, str):
                raise InvalidArgument(f"{where}: {key} must be a string")
            values[field] = value
            break
    enabled = entry.get("enabled", True)
    if not isinstance(enabled, bool):
        raise InvalidArgument(f"{where}: enabled must be true or false")
    at = entry.get("at")
    if at is not None and not isinstance(at, str):
        # YAML reads an unquoted 2026-12-01T09:00:00Z as a datetime: take it as the ISO text it was.
        at = at.isoformat() if hasattr(at, "isoformat") else None
        if at is None:
            raise InvalidArgument(f"{where}: at must be an ISO 8601 time like '2026-12-01T09:00Z'")
    if at is not None and values.get("schedule"):
        raise InvalidArgument(f"{where}: give either schedule (a recurring job) or at (a one-off job), not both")
    if at is None and not values.get("schedule"):
        raise InvalidArgument(f"{where}: schedule (or at, for a one-off job) is required")
    job = Job(job_id=job_id_for(source, name), name=name, prompt=values.pop("prompt", ""), enabled=enabled,
              source=source, schedule=values.pop("schedule", ""), **values)
    job = apply_defaults(job)
    try:
        if at is not None:
            job.run_at = parse_time(at, job.timezone)
        validate_job(job)
    except InvalidArgument as exc:
        raise InvalidArgument(f"{where}: {exc.message}") from None
    return job


def plan_reconcile(current: list[Job], desired: list[Job], source: str, now: float) -> ReconcilePlan:
    """What makes the jobs of `source` among `current` equal to `desired`: jobs of other sources
    (the API's, another file's) are never touched. Refuses (InvalidArgument) a one-off time that
    is being set but lies in the past, before anything is changed."""
    mine = {job.name: job for job in current if job.source == source}
    plan = ReconcilePlan()
    for want in desired:
        have = mine.pop(want.name, None)
        if have is None:
            if want.run_at:
                _check_at(want, now)
            plan.added.append(want)
            continue
        changes = {f: getattr(want, f) for f in EDITABLE_FIELDS if getattr(want, f) != getattr(have, f)}
        if changes:
            if "run_at" in changes and want.run_at:
                _check_at(want, now)
            plan.changed.append((have, changes))
    plan.removed = list(mine.values())
    return plan


def _check_at(job: Job, now: float) -> None:
    try:
        check_run_at(job.run_at, now)
    except InvalidArgument as exc:
        raise InvalidArgument(f"job {job.name[:60]!r}: {exc.message}") from None
