"""Wake-ups: the agent's `schedule_wakeup` tool asks to be resumed in its own session later, with
a note as the message (docs/scheduler.md, "Wake-ups"). A wake-up is a one-off job (`run_at`) on
the session, so it fires once, durably, through the leader, like any job — and `agentmesh cron
list` shows it, `cron delete` cancels it. Its `source` is "wakeup:<session id>", which is how
the bounds below count a session's pending ones.

The bounds keep an agent from filling the scheduler: at most MAX_PENDING wake-ups waiting per
session, at most HORIZON_S ahead. A refusal is a sentence the model reads in its tool result.
"""

from __future__ import annotations

import asyncio
import math
import time

from agentmesh import error_reasons
from agentmesh.errors import InvalidArgument, ResourceExhausted
from agentmesh.ids import validate_id
from agentmesh.scheduler.engine import Scheduler
from agentmesh.scheduler.model import Job

__all__ = ["HORIZON_S", "MAX_NOTE_CHARS", "MAX_PENDING", "schedule_wakeup", "wakeup_source"]

MAX_PENDING = 10
HORIZON_S = 30 * 86400.0
MAX_NOTE_CHARS = 4000
# Count-then-create of one session's wake-ups, within this replica (any replica takes creates).
_LOCK = asyncio.Lock()


def wakeup_source(session_id: str) -> str:
    return f"wakeup:{session_id}"


async def schedule_wakeup(core: Scheduler, session_id: str, run_at: float, note: str, created_by: str = "",
                          created_by_tenant: str = "") -> Job:
    validate_id(session_id, "session_id")
    if not note.strip():
        raise InvalidArgument("note is required: the message the session is resumed with", field="note")
    if len(note) > MAX_NOTE_CHARS:
        raise InvalidArgument(f"note is {len(note)} characters; at most {MAX_NOTE_CHARS}", field="note")
    now = time.time()
    if not math.isfinite(run_at) or run_at <= now:
        raise InvalidArgument("run_at must be a time in the future", field="run_at")
    if run_at - now > HORIZON_S:
        raise InvalidArgument(f"a wake-up may be at most {HORIZON_S / 86400:.0f} days ahead", field="run_at")
    async with _LOCK:
        pending = [j for j in await core.list_jobs()
                   if j.source == wakeup_source(session_id) and j.run_at and not j.done_at]
        if len(pending) >= MAX_PENDING:
            raise ResourceExhausted(
                f"session {session_id!r} has {len(pending)} wake-ups pending, the most it may have; "
                "wait for one to fire, or ask the user to cancel one (`agentmesh cron delete JOB_ID`)",
                reason=error_reasons.QUOTA_EXCEEDED, metadata={"limit": "wakeups_per_session"})
        job = Job(job_id="", name=f"wake-up of {session_id}", schedule="", prompt=note, session_id=session_id,
                  run_at=run_at, if_busy="enqueue", source=wakeup_source(session_id),
                  created_by=created_by, created_by_tenant=created_by_tenant)
        return await core.create_job(job)
