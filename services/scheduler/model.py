"""The scheduler's records: jobs and runs, as plain data the core, store and adapter share."""

from __future__ import annotations

from dataclasses import dataclass

from agentmesh import turn_input

CONCURRENCY_POLICIES = ("forbid", "replace", "allow")
MISSED_RUN_POLICIES = ("run_once", "skip")
# ChatOptions.if_busy (the gateway's): "" leaves it to the gateway's AGENTMESH_GATEWAY_IF_BUSY.
IF_BUSY_POLICIES = ("", *turn_input.IF_BUSY_POLICIES)
# Plan mode of a job's runs: none, approved at once, or held for a person.
PLAN_MODES = ("", "auto", "ask")
RUN_STATUSES = ("running", "succeeded", "failed", "skipped", "cancelled")
TRIGGERS = ("schedule", "manual", "catch_up", "startup")


@dataclass
class Job:
    job_id: str
    name: str
    schedule: str
    prompt: str
    session_id: str = ""  # empty: a fresh session per run
    mode: str = ""
    enabled: bool = True
    timezone: str = "UTC"
    concurrency_policy: str = "forbid"
    missed_run_policy: str = "run_once"
    created_at: float = 0.0
    updated_at: float = 0.0
    # Interval schedules count from here, so a restart keeps their phase.
    anchor_at: float = 0.0
    next_run_at: float = 0.0  # 0: disabled, startup-only, or never again
    last_run_at: float = 0.0
    # Who created the job (the principal of the CreateJob call): its runs are made on their
    # behalf, so the principal reaches the gateway and every hop after it.
    created_by: str = ""
    created_by_tenant: str = ""
    # ChatOptions.if_busy of its runs: what a run does to its session's running turn.
    if_busy: str = ""
    # Plan mode of its runs (PLAN_MODES).
    plan: str = ""
    # A one-off job fires once at run_at (schedule empty); done_at is when it fired. It is then
    # kept for its history and never fired again.
    run_at: float = 0.0
    done_at: float = 0.0
    # Who declares it: "" the API, "file:<path>" the watched jobs file, "apply:<name>" `cron apply`.
    # The file's reconcile touches only its own jobs.
    source: str = ""
    # The named agent its runs talk to (ChatOptions.agent, "NAME" or "NAME@VERSION"); "": the default.
    agent: str = ""


@dataclass
class Run:
    run_id: str
    job_id: str
    status: str
    scheduled_for: float
    started_at: float
    finished_at: float = 0.0
    session_id: str = ""
    trace_id: str = ""
    summary: str = ""
    error: str = ""
    trigger: str = "schedule"
    owner: str = ""  # the scheduler instance executing it


@dataclass(frozen=True)
class RunRequest:
    session_id: str
    prompt: str
    mode: str
    timeout_s: float
    principal: str = ""  # the job's creator; empty: the scheduler itself
    tenant: str = ""
    if_busy: str = ""
    plan: str = ""
    agent: str = ""


@dataclass(frozen=True)
class RunOutcome:
    status: str  # "succeeded" | "failed" | "cancelled"
    session_id: str = ""
    trace_id: str = ""
    summary: str = ""
    error: str = ""
