"""`agentmesh cron add|list|run|toggle|delete|history|import|apply`: scheduled agent runs.

Talks to the scheduler at AGENTMESH_SCHEDULER_ADDR. Schedules, timezones and session ids are
checked here first, so a typo is a usage error (exit 2) before anything reaches the server;
the server checks everything again and its refusals exit 1.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import grpc

from agentmesh.cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    call_metadata,
    channel_to,
    load_settings,
    print_json,
    rpc_failure,
    to_dict,
)
from agentmesh.clients.gateway import SchedulerClient
from agentmesh.errors import InvalidArgument
from agentmesh.v1 import scheduler_pb2

CALL_TIMEOUT_S = 30.0


def register(subparsers) -> None:
    cron = subparsers.add_parser("cron", help="schedule agent runs: add, list, run, toggle, delete, history, import, "
                                              "apply, cancel-wakeup")
    verbs = cron.add_subparsers(dest="verb", required=True)

    add = verbs.add_parser("add", help="add a job; prints its id")
    add.add_argument("message", nargs="*", help="the message the agent receives (or --prompt)")
    add.add_argument("--name", default="", help="default: the start of the message")
    add.add_argument("--schedule", default="",
                     help="'*/5 * * * *', 'every 30s|10m|2h|1d', 'daily 09:00', 'hourly :15' or 'startup'")
    add.add_argument("--at", default="", help="run once at this time: '2026-12-01T09:00Z' (no offset: in --timezone)")
    add.add_argument("--in", dest="delay", default="", help="run once after this delay: 30s, 10m, 2h, 1d")
    add.add_argument("--prompt", default="", help="the message the agent receives on each run")
    add.add_argument("--session", default="", help="run in this session every time (default: a fresh one per run)")
    add.add_argument("--timezone", default="UTC", help="IANA timezone for cron and daily times (default UTC)")
    add.add_argument("--mode", default="", help="run mode passed to the agent, e.g. deep")
    add.add_argument("--concurrency", choices=("forbid", "replace", "allow"), default="forbid",
                     help="when the previous run is still going: skip (forbid), cancel it (replace), or overlap (allow)")
    add.add_argument("--if-busy", choices=("reject", "enqueue", "interrupt", "rollback"), default="",
                     help="when the job's session is already running a turn: fail the run (reject), wait (enqueue), "
                          "interrupt it, or roll it back (default: the gateway's AGENTMESH_GATEWAY_IF_BUSY)")
    add.add_argument("--plan", choices=("auto", "ask"), default="",
                     help="plan mode for its runs: the agent plans onto the task board first; auto approves the "
                          "plan at once, ask holds it for a person (agentmesh approvals)")
    add.add_argument("--agent", default="",
                     help="the named agent its runs talk to, NAME or NAME@VERSION (default: the namespace's default "
                          "agent; see agentmesh agents list)")
    add.add_argument("--missed", choices=("run_once", "skip"), default="run_once",
                     help="after downtime: run once to catch up, or skip the missed runs")
    add.add_argument("--disabled", action="store_true", help="create the job switched off")
    add.set_defaults(func=add_job)

    listing = verbs.add_parser("list", help="all jobs")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=list_jobs)

    run = verbs.add_parser("run", help="start a run of a job now")
    run.add_argument("job_id")
    run.set_defaults(func=run_job)

    toggle = verbs.add_parser("toggle", help="switch a job off, or back on")
    toggle.add_argument("job_id")
    toggle.set_defaults(func=toggle_job)

    delete = verbs.add_parser("delete", help="delete a job and its history")
    delete.add_argument("job_id")
    delete.set_defaults(func=delete_job)

    cancel = verbs.add_parser("cancel-wakeup", help="cancel a wake-up an agent asked for (schedule_wakeup)")
    cancel.add_argument("job_id")
    cancel.set_defaults(func=cancel_wakeup)

    history = verbs.add_parser("history", help="a job's runs, newest first")
    history.add_argument("job_id")
    history.add_argument("--limit", type=int, default=20, help="how many runs (1-500, default 20)")
    history.add_argument("--json", action="store_true")
    history.set_defaults(func=job_history)

    imp = verbs.add_parser("import", help="import the jobs of a cron.json from a single-process agent server")
    imp.add_argument("file", type=Path)
    imp.set_defaults(func=import_jobs)

    apply = verbs.add_parser("apply", help="make the jobs of a jobs file (JSON or YAML) exactly those it declares")
    apply.add_argument("file", type=Path)
    apply.set_defaults(func=apply_jobs)


# --- plumbing ----------------------------------------------------------------------------


async def _call(method: str, request):
    settings = load_settings()
    async with channel_to(settings, "scheduler") as channel:
        stub = SchedulerClient(channel).stub
        try:
            return await getattr(stub, method)(request, metadata=call_metadata(settings), timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as err:
            raise rpc_failure(err, "scheduler", settings) from None


def _check_locally(schedule: str, timezone: str, session_id: str, where: str = "") -> None:
    """The checks that need no server, so a typo is a usage error."""
    from agentmesh.ids import validate_id
    from agentmesh.scheduler.schedules import load_timezone, parse_schedule

    try:
        if schedule:  # a one-off job has none
            parse_schedule(schedule)
        load_timezone(timezone)
        if session_id:
            validate_id(session_id, "session id")
    except InvalidArgument as exc:
        raise CliError(f"{where}{exc.message}", EXIT_USAGE) from None


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


# --- verbs -------------------------------------------------------------------------------


def _one_off_time(args) -> float:
    """run_at of `--at` / `--in` (0 for a recurring job), checked here so a bad time exits 2."""
    from agentmesh.scheduler.schedules import check_run_at, load_timezone, parse_delay, parse_time

    try:
        if args.delay:
            return time.time() + parse_delay(args.delay)
        if args.at:
            load_timezone(args.timezone)
            run_at = parse_time(args.at, args.timezone)
            check_run_at(run_at, time.time())
            return run_at
    except InvalidArgument as exc:
        raise CliError(f"{'--in' if args.delay else '--at'}: {exc.message}", EXIT_USAGE) from None
    return 0.0


async def add_job(args) -> int:
    if sum(map(bool, (args.schedule, args.at, args.delay))) != 1:
        raise CliError("exactly one of --schedule (a recurring job), --at TIME or --in DELAY (a one-off job) is required",
                       EXIT_USAGE)
    if bool(args.prompt) == bool(args.message):
        raise CliError("the message is required, once: as the last arguments or as --prompt", EXIT_USAGE)
    prompt = args.prompt or " ".join(args.message)
    run_at = _one_off_time(args)
    _check_locally(args.schedule, args.timezone, args.session)
    job = scheduler_pb2.Job(
        name=args.name or " ".join(prompt.split())[:60], schedule=args.schedule, prompt=prompt,
        session_id=args.session, mode=args.mode, timezone=args.timezone, concurrency_policy=args.concurrency,
        missed_run_policy=args.missed, enabled=not args.disabled, if_busy=args.if_busy, plan=args.plan, run_at=run_at,
        agent=args.agent,
    )
    created = await _call("CreateJob", scheduler_pb2.CreateJobRequest(job=job))
    print(created.job_id)
    return EXIT_OK


def _timetable(job: scheduler_pb2.Job) -> str:
    if not job.run_at:
        return job.schedule
    return f"{'done' if job.done_at else 'at'} {time.strftime('%Y-%m-%d %H:%M', time.localtime(job.run_at))}"


async def list_jobs(args) -> int:
    response = await _call("ListJobs", scheduler_pb2.ListJobsRequest())
    jobs = response.jobs
    if args.json:
        print_json([to_dict(j) for j in jobs])
        return EXIT_OK
    if response.HasField("jobs_file"):
        status = response.jobs_file
        if status.ok:
            print(f"jobs file {status.path}: {status.jobs} jobs, applied {_when(status.applied_at)}")
        elif status.error:
            print(f"jobs file {status.path}: NOT APPLIED, the jobs stay as they were: {status.error}")
        else:
            print(f"jobs file {status.path}: not read yet (the active scheduler reads it)")
    if not jobs:
        print('no jobs yet — add one with: agentmesh cron add --name NAME --schedule "daily 09:00" --prompt TEXT')
        return EXIT_OK
    print(f"{'ID':<24} {'ON':<3} {'SCHEDULE':<18} {'TZ':<16} {'NEXT RUN':<19}  {'LAST RUN':<19}  NAME")
    for j in jobs:
        print(f"{j.job_id:<24} {'yes' if j.enabled else 'no':<3} {_timetable(j):<18} {j.timezone:<16} "
              f"{_when(j.next_run_at):<19}  {_when(j.last_run_at):<19}  {j.name}")
    return EXIT_OK


async def run_job(args) -> int:
    run = await _call("TriggerJob", scheduler_pb2.TriggerJobRequest(job_id=args.job_id))
    print(f"started run {run.run_id} in session {run.session_id}")
    print(f"follow it with: agentmesh cron history {args.job_id}")
    return EXIT_OK


async def toggle_job(args) -> int:
    job = await _call("ToggleJob", scheduler_pb2.ToggleJobRequest(job_id=args.job_id))
    if job.enabled:
        nxt = f"; next run {_when(job.next_run_at)}" if job.next_run_at else ""
        print(f"job {job.job_id} enabled{nxt}")
    else:
        print(f"job {job.job_id} disabled")
    return EXIT_OK


async def delete_job(args) -> int:
    response = await _call("DeleteJob", scheduler_pb2.DeleteJobRequest(job_id=args.job_id))
    if not response.deleted:
        raise CliError(f"no job with id {args.job_id!r}; `agentmesh cron list` shows the jobs")
    print(f"deleted job {args.job_id}")
    return EXIT_OK


async def cancel_wakeup(args) -> int:
    response = await _call("CancelWakeup", scheduler_pb2.CancelWakeupRequest(job_id=args.job_id))
    if not response.deleted:
        raise CliError(f"no wake-up with id {args.job_id!r}; `agentmesh cron list` shows them")
    print(f"cancelled wake-up {args.job_id}")
    return EXIT_OK


async def job_history(args) -> int:
    if not 1 <= args.limit <= 500:
        raise CliError("--limit must be between 1 and 500", EXIT_USAGE)
    runs = (await _call("ListRuns", scheduler_pb2.ListRunsRequest(job_id=args.job_id, limit=args.limit))).runs
    if args.json:
        print_json([to_dict(r) for r in runs])
        return EXIT_OK
    if not runs:
        print(f"job {args.job_id} has not run yet")
        return EXIT_OK
    print(f"{'STARTED':<19}  {'STATUS':<9} {'TRIGGER':<8} {'SECONDS':>7}  {'SESSION':<40} {'TRACE':<32}  RESULT")
    for r in runs:
        seconds = f"{r.finished_at - r.started_at:.1f}" if r.finished_at else "-"
        result = (r.error or r.summary).replace("\n", " ")
        print(f"{_when(r.started_at):<19}  {r.status:<9} {r.trigger:<8} {seconds:>7}  {r.session_id or '-':<40} "
              f"{r.trace_id or '-':<32}  {result[:80]}")
    return EXIT_OK


# --- cron.json import --------------------------------------------------------------------


def _read_cron_file(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}", EXIT_USAGE) from None
    except json.JSONDecodeError as exc:
        raise CliError(f"{path} is not valid JSON: {exc.msg} at line {exc.lineno}", EXIT_USAGE) from None
    if isinstance(data, dict) and isinstance(data.get("jobs"), list):
        data = data["jobs"]
    if not isinstance(data, list):
        raise CliError(f'{path}: expected a list of jobs, or an object {{"jobs": [...]}}', EXIT_USAGE)
    return data


def _job_from_entry(index: int, entry: Any) -> scheduler_pb2.Job:
    where = f"job {index + 1}"
    if not isinstance(entry, dict):
        raise CliError(f"{where}: expected an object with id, name, schedule, prompt", EXIT_USAGE)
    job_id = str(entry.get("id") or "")
    where = f"job {index + 1}{f' (id {job_id!r})' if job_id else ''}: "

    def text(key: str, *aliases: str) -> str:
        for name in (key, *aliases):
            value = entry.get(name)
            if value is None:
                continue
            if not isinstance(value, str):
                raise CliError(f"{where}{name} must be a string", EXIT_USAGE)
            return value
        return ""

    prompt = text("prompt", "message")
    schedule = text("schedule", "cron")
    if not schedule or not prompt:
        raise CliError(f"{where}schedule and prompt are required", EXIT_USAGE)
    enabled = entry.get("enabled", True)
    if not isinstance(enabled, bool):
        raise CliError(f"{where}enabled must be true or false", EXIT_USAGE)
    timezone = text("timezone", "tz") or "UTC"
    session_id = text("session_id")
    if job_id:
        from agentmesh.ids import validate_id

        try:
            validate_id(job_id, "id")
        except InvalidArgument as exc:
            raise CliError(f"{where}{exc.message}", EXIT_USAGE) from None
    _check_locally(schedule, timezone, session_id, where)
    return scheduler_pb2.Job(
        job_id=job_id, name=text("name") or job_id or prompt[:60], schedule=schedule, prompt=prompt,
        session_id=session_id, mode=text("mode"), enabled=enabled, timezone=timezone,
        concurrency_policy=text("concurrency_policy"), missed_run_policy=text("missed_run_policy"),
    )


async def import_jobs(args) -> int:
    # Every entry is checked before the first is sent: a bad file changes nothing.
    jobs = [_job_from_entry(i, entry) for i, entry in enumerate(_read_cron_file(args.file))]
    settings = load_settings()
    created = updated = 0
    async with channel_to(settings, "scheduler") as channel:
        stub = SchedulerClient(channel).stub
        metadata = call_metadata(settings)
        for job in jobs:
            try:
                try:
                    await stub.CreateJob(scheduler_pb2.CreateJobRequest(job=job), metadata=metadata,
                                         timeout=CALL_TIMEOUT_S)
                    created += 1
                except grpc.aio.AioRpcError as err:
                    if err.code() != grpc.StatusCode.ALREADY_EXISTS:
                        raise
                    # Importing the same file again updates the jobs it created.
                    await stub.UpdateJob(scheduler_pb2.UpdateJobRequest(
                        job=job, update_mask=["name", "schedule", "prompt", "session_id", "mode", "enabled",
                                              "timezone", "concurrency_policy", "missed_run_policy"]),
                        metadata=metadata, timeout=CALL_TIMEOUT_S)
                    updated += 1
            except grpc.aio.AioRpcError as err:
                failure = rpc_failure(err, "scheduler", settings)
                sys.stderr.write(f"agentmesh: imported {created + updated} of {len(jobs)} jobs before the error\n")
                raise CliError(f"job {job.job_id or job.name!r}: {failure}", failure.exit_code) from None
    print(f"imported {len(jobs)} jobs from {args.file}: {created} created, {updated} updated")
    return EXIT_OK


# --- cron apply: a jobs file reconciled through the API -----------------------------------


def _job_of(message: scheduler_pb2.Job):
    from agentmesh.scheduler.model import Job

    return Job(job_id=message.job_id, name=message.name, schedule=message.schedule, prompt=message.prompt,
               session_id=message.session_id, mode=message.mode, enabled=message.enabled, timezone=message.timezone,
               concurrency_policy=message.concurrency_policy, missed_run_policy=message.missed_run_policy,
               if_busy=message.if_busy, plan=message.plan, run_at=message.run_at, done_at=message.done_at,
               source=message.source, agent=message.agent)


async def apply_jobs(args) -> int:
    """The scheduler's jobs-file reconcile, through the API: jobs of source `apply:<file name>`
    become exactly those the file declares; no other job is touched."""
    from agentmesh.scheduler.declared import declared_jobs, plan_reconcile, read_document

    source = f"apply:{args.file.name}"
    try:
        text = args.file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read {args.file}: {getattr(exc, 'strerror', None) or exc}", EXIT_USAGE) from None
    try:
        desired = declared_jobs(read_document(text, args.file.name), source)
    except InvalidArgument as exc:
        raise CliError(f"{args.file}: {exc.message}; nothing was changed", EXIT_USAGE) from None
    settings = load_settings()
    async with channel_to(settings, "scheduler") as channel:
        stub = SchedulerClient(channel).stub
        metadata = call_metadata(settings)
        try:
            listed = await stub.ListJobs(scheduler_pb2.ListJobsRequest(), metadata=metadata, timeout=CALL_TIMEOUT_S)
            try:
                plan = plan_reconcile([_job_of(j) for j in listed.jobs], desired, source, time.time())
            except InvalidArgument as exc:
                raise CliError(f"{args.file}: {exc.message}; nothing was changed", EXIT_USAGE) from None
            for job in plan.added:
                await stub.CreateJob(scheduler_pb2.CreateJobRequest(job=_proto_of(job)), metadata=metadata,
                                     timeout=CALL_TIMEOUT_S)
                print(f"added   {job.name} ({job.job_id})")
            for job, changes in plan.changed:
                wanted = _proto_of(dataclasses.replace(job, **changes))
                await stub.UpdateJob(scheduler_pb2.UpdateJobRequest(job=wanted, update_mask=sorted(changes)),
                                     metadata=metadata, timeout=CALL_TIMEOUT_S)
                print(f"changed {job.name} ({job.job_id}): {', '.join(sorted(changes))}")
            for job in plan.removed:
                await stub.DeleteJob(scheduler_pb2.DeleteJobRequest(job_id=job.job_id), metadata=metadata,
                                     timeout=CALL_TIMEOUT_S)
                print(f"removed {job.name} ({job.job_id})")
        except grpc.aio.AioRpcError as err:
            raise rpc_failure(err, "scheduler", settings) from None
    print(f"applied {args.file}: {plan.summary()}" if not plan.empty else f"applied {args.file}: nothing changed")
    return EXIT_OK


def _proto_of(job) -> scheduler_pb2.Job:
    return scheduler_pb2.Job(
        job_id=job.job_id, name=job.name, schedule=job.schedule, prompt=job.prompt, session_id=job.session_id,
        mode=job.mode, enabled=job.enabled, timezone=job.timezone, concurrency_policy=job.concurrency_policy,
        missed_run_policy=job.missed_run_policy, if_busy=job.if_busy, plan=job.plan, run_at=job.run_at,
        source=job.source,
    )
