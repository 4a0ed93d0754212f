"""Starting a teammate again whose run ended without it finishing (docs/teams.md, "Resilience"),
from wherever that end is seen in the agent: the lead's turn looking at its teammates
(teams.TeamLead), or the teammate's own turn cancelled under it — its gateway went away — which
watches its run's record until the gateway (restarted, or another replica, after the run's
lease) says how it ended (`watch_run`). The gateway does the same where it sees a run end
(gateway/team_rpcs.TeammateRecovery); each start is claimed first with a compare-and-set on the
teammate's `run_id`, so whoever comes first starts it, once.

What a teammate is started with is its record's `start` (spawn_teammate writes it: the lead's
model, permission mode, tools as a ceiling, budgets, the restart limit and the lead turn's
trace context), so any of them starts it the same way.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

from opentelemetry import context as otel_context
from opentelemetry import propagate

from agentmesh.agent.capabilities.team_store import LEAD, Team, TeammateRuns, TeammateStart, mate_session
from agentmesh.errors import AgentmeshError
from agentmesh.logs import get_logger

__all__ = ["RESUME", "recover", "start_record", "watch_run"]

log = get_logger("agentmesh.agent.teams")

FINISHED = "finished"
LAST_CHARS = 500
RESUME = (
    "Your previous run ended before it was done ({error}); you are started again in your session. Carry on with "
    "your task from where you were: messages that arrived meanwhile follow."
)
ENDED = ("succeeded", "failed", "interrupted", "cancelled")
# A teammate's watch of its own run after its turn was cancelled: the gateway's answer is polled
# with this backoff, for at most WATCH_S (a lost run is recorded once its lease runs out).
WATCH_FIRST_S, WATCH_MAX_S, WATCH_S = 0.5, 5.0, 900.0


class _Taken(Exception):
    """Another lead turn, replica or gateway restarts (or ended) this teammate already."""


def start_record(start: TeammateStart, max_restarts: int) -> dict[str, Any]:
    """The teammate record's `start`: what any observer starts it again with."""
    trace: dict[str, str] = {}
    propagate.inject(trace)
    return {"model": start.model, "permission_mode": start.permission_mode, "allow": list(start.allow),
            "deny": list(start.deny), "max_iterations": start.max_iterations, "token_budget": start.token_budget,
            "max_restarts": max_restarts, "trace": trace}


def _claim(expected: str, **fields: Any) -> Callable[[dict[str, Any] | None], dict[str, Any]]:
    def claim(body: dict[str, Any] | None) -> dict[str, Any]:
        if body is None or body.get("run_id") != expected or body.get("state") in (FINISHED, "starting"):
            raise _Taken
        return {**body, **fields, "updated_at": time.time()}
    return claim


async def recover(team: Team, runs: TeammateRuns, mate: dict[str, Any], state: str, error: str,
                  fallback: TeammateStart | None = None, max_restarts: int = 2, ended: str = "") -> str:
    """Act on teammate `mate` whose run `mate["run_id"]` (when given: `ended`, and only while it
    is still the teammate's) ended as `state`: a failed or
    interrupted one is started again (its record's `start`, else `fallback`), a cancelled one is
    finished, and after its restart limit a failing one is finished and the lead told. What was
    done: "restarted", "finished", "gave_up", "not_restarted", or "" (nothing: not ended, or
    someone else acts on it)."""
    run_id, name = str(mate.get("run_id", "")), str(mate["name"])
    if not run_id or mate.get("state") in (FINISHED, "starting") or state not in ENDED or state == "succeeded":
        return ""
    if ended and ended != run_id:
        return ""  # started again already, by whoever saw the end first
    try:
        if state == "cancelled":
            await team.change("mate", name, _claim(run_id, state=FINISHED, stop_reason="cancelled"))
            await team.post(LEAD, name, f"[{name} finished (cancelled)] {mate.get('last_message') or '(no answer)'}")
            return "finished"
        stored = mate.get("start") if isinstance(mate.get("start"), dict) else None
        limit = int(stored.get("max_restarts", max_restarts)) if stored else max_restarts
        restarts = int(mate.get("restarts", 0))
        if restarts >= limit:
            note = f"its run {run_id} failed ({error or state}) after {restarts} restarts"
            await team.change("mate", name, _claim(run_id, state=FINISHED, stop_reason="failed",
                                                   last_message=note[:LAST_CHARS]))
            await team.post(LEAD, name, f"[{name} finished (failed)] {note}")
            log.warning("teammate given up", team=team.team, name=name, run_id=run_id)
            return "gave_up"
        if stored is None and fallback is None:
            return ""
        await team.change("mate", name, _claim(run_id, run_id="", state="starting", restarts=restarts + 1))
    except _Taken:
        return ""
    message = RESUME.format(error=(error or state)[:LAST_CHARS])
    session_id = str(mate.get("session_id") or mate_session(team.team, name))
    if stored is not None:
        start = TeammateStart(
            session_id=session_id, namespace=team.namespace, message=message, model=str(stored.get("model", "")),
            permission_mode=str(stored.get("permission_mode", "")), allow=tuple(stored.get("allow", ())),
            deny=tuple(stored.get("deny", ())), max_iterations=int(stored.get("max_iterations", 0)),
            token_budget=int(stored.get("token_budget", 0)))
        token = otel_context.attach(propagate.extract(dict(stored.get("trace", {}))))
    else:
        assert fallback is not None
        start = TeammateStart(**{**fallback.__dict__, "session_id": session_id, "message": message})
        token = None
    try:
        new_run = await runs.start(start)
    except AgentmeshError as exc:
        await team.set_mate(name, state=FINISHED, stop_reason="not_restarted", last_message=exc.message)
        await team.post(LEAD, name, f"[{name} finished (failed)] not restarted: {exc.message}")
        return "not_restarted"
    finally:
        if token is not None:
            otel_context.detach(token)
    await team.set_mate(name, run_id=new_run, state="started")
    log.info("teammate restarted", team=team.team, name=name, failed_run=run_id, run_id=new_run)
    return "restarted"


async def watch_run(team: Team, runs: TeammateRuns, name: str, run_id: str) -> None:
    """A teammate whose turn was cancelled under it (its gateway's call ended) cannot tell a stop
    asked for from a gateway that went away: it asks the gateway how its run ended — a
    restarted or other replica answers, recording a lost run `interrupted` once its lease runs
    out — and acts on the answer as its lead would."""
    deadline, pause = time.monotonic() + WATCH_S, WATCH_FIRST_S
    while time.monotonic() < deadline:
        await asyncio.sleep(pause)
        pause = min(pause * 2, WATCH_MAX_S)
        try:
            state, error = await runs.state(run_id)
            if state not in ENDED:
                continue
            mate = await team.get("mate", name)
            if mate is not None:
                await recover(team, runs, mate.body, state, error, ended=run_id)
            return
        except AgentmeshError as exc:  # the gateway is away a while yet: ask again
            log.info("teammate's run not readable yet", name=name, run_id=run_id, error=exc.message)
    log.warning("teammate's run never ended on record", name=name, run_id=run_id)
