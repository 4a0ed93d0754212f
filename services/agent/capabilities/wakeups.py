"""`schedule_wakeup(when, note)`: the agent asks to be resumed in its own session later, with the
note as the message (docs/scheduler.md, "Wake-ups") — to check on a build, follow up on a reply,
or continue long work after a pause.

The scheduler keeps the wake-up as a one-off job on the session and fires it once, durably
(restarts included), through the gateway like a user's message. It bounds them (10 pending per
session, 30 days ahead) and says so in a sentence the model reads. The scheduler is reached
through the `WakeupScheduler` port; the composition root (server.py) gives the gRPC client.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from typing import Protocol

from agentmesh.agent.loop.turn import Capability, TurnContext
from agentmesh.agent.types import ToolCall, ToolOutcome, ToolSpec
from agentmesh.errors import AgentmeshError
from agentmesh.toolargs import ArgumentsSchema

__all__ = ["WakeupScheduler", "Wakeups", "parse_when"]

SPEC = ToolSpec(
    name="schedule_wakeup",
    description=(
        "Ask to be resumed in this session later: at `when`, the session gets `note` as a new message and you "
        "continue from there (the user need not be present). Use it to check back on something that takes time. "
        "`when` is a delay (\"90s\", \"10m\", \"2h\", \"1d\") or a UTC time (\"2026-12-01T09:00:00Z\"); at most 30 "
        "days ahead, at most 10 pending per session. The user can list (`agentmesh cron list`) and cancel them."
    ),
    parameters={"type": "object", "properties": {
        "when": {"type": "string", "maxLength": 64, "description": "A delay like 10m or a UTC ISO time."},
        "note": {"type": "string", "minLength": 1, "maxLength": 4000,
                 "description": "The message you will be resumed with: say what to do then."},
    }, "required": ["when", "note"], "additionalProperties": False},
)
_SCHEMA = ArgumentsSchema(SPEC.name, SPEC.parameters)
_DELAY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class WakeupScheduler(Protocol):
    async def schedule_wakeup(self, session_id: str, run_at: float, note: str) -> str:
        """The job id of the wake-up; raises an AgentmeshError with the scheduler's sentence."""


def parse_when(when: str, now: float) -> float:
    """Unix seconds of `when`: a delay ("10m") from `now`, or an ISO time (UTC unless it says)."""
    if match := _DELAY.match(when):
        return now + float(match.group(1)) * _UNITS[match.group(2)]
    try:
        moment = datetime.fromisoformat(when.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"when {when[:64]!r} is neither a delay like 10m or 2h nor an ISO time "
                         "like 2026-12-01T09:00:00Z") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


class Wakeups(Capability):
    def __init__(self, ctx: TurnContext, scheduler: WakeupScheduler):
        super().__init__(ctx)
        self._scheduler = scheduler

    def tools(self) -> list[ToolSpec]:
        return [SPEC]

    async def execute(self, call: ToolCall) -> ToolOutcome:
        try:
            args = _SCHEMA.parse(call.arguments_json)
            run_at = parse_when(args["when"], time.time())
        except ValueError as exc:
            return ToolOutcome.error(call, "invalid_arguments", f"error: {exc}")
        try:
            job_id = await self._scheduler.schedule_wakeup(self.ctx.request.session_id, run_at, args["note"])
        except AgentmeshError as exc:
            return ToolOutcome.error(call, "wakeup_refused", f"error: schedule_wakeup: {exc.message}")
        at = datetime.fromtimestamp(run_at, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
        return ToolOutcome(call_id=call.call_id, name=call.name,
                           output=f"Wake-up {job_id} scheduled for {at}: this session will get your note then.",
                           data={"job_id": job_id, "run_at": run_at})
