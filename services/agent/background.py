"""Results of background commands (`background_run`, run by the tools service) put in front of
the model: before each step, the agent asks the tools service which of the session's commands
ended since it last asked, sends a `background_result` event for each, and adds their results
to the turn as a system message (persisted, so later steps and turns see it too). The model
never has to poll. A cancelled turn stops the session's running background commands.

Only a top-level turn does this: sub-agents share their root session's workspace, and a child
taking its parent's results would hide them from the parent.

Once an answer says none of the session's commands is running, later steps of the turn do not
ask again until the model has started one (`background_run`) or a sub-agent (who may have):
a command only starts through such a call, so there is nothing to collect meanwhile, and a
tool-using turn makes one call to the tools service fewer per step. (A command started at the
same moment by a person with `agentmesh tools run` is collected at the next turn's start.)"""

from __future__ import annotations

from agentmesh.agent.context import clip
from agentmesh.agent.subagents import DELEGATE_TASK
from agentmesh.agent.turn import Capability
from agentmesh.agent.types import BackgroundDone, BackgroundResultEvent, ChatMessage, StatusEvent
from agentmesh.errors import AgentmeshError
from agentmesh.logs import get_logger

log = get_logger("agentmesh.agent.background")

BACKGROUND_RUN = "background_run"


def note(done: BackgroundDone, limit: int) -> str:
    r = done.result
    if done.status == "stopped":
        how = "was stopped before it finished"
    elif r.error_kind == "timeout":
        how = "ran past its lifetime and was stopped"
    else:
        how = f"finished with exit code {r.exit_code}"
    return (f"Background command {done.id} (`{done.command}`) {how} after {done.seconds:.0f} s. "
            f"Its output:\n{clip(r.output, limit)}")


# Calls that may start a background command: directly, or in a sub-agent's turn.
STARTERS = frozenset({BACKGROUND_RUN, DELEGATE_TASK})


def may_have_started(messages: list[ChatMessage]) -> bool:
    return any(call.name in STARTERS for m in messages for call in m.tool_calls)


class BackgroundResults(Capability):
    # Where in the turn's messages the last answer said nothing runs; None: not known to be quiet.
    _quiet_from: int | None = None

    def _offered(self) -> bool:
        return self.ctx.agent.background is not None and any(t.name == BACKGROUND_RUN for t in self.ctx.tools)

    async def before_step(self, step: int, turn: list[ChatMessage]) -> None:
        background = self.ctx.agent.background
        if background is None or not self._offered():
            return
        if self._quiet_from is not None and not may_have_started(turn[self._quiet_from:]):
            return
        try:
            check = await background.take_finished(self.ctx.request.session_id)
        except AgentmeshError as exc:
            log.warning("background results unavailable", error=exc.message)
            self._quiet_from = None
            return
        finished = check.finished
        if not finished:
            self._quiet_from = len(turn) if check.running == 0 else None
            return
        limit = self.ctx.settings.tool_output_chars
        for done in finished:
            self.ctx.emit(BackgroundResultEvent(done))
            self.ctx.emit(StatusEvent(f"background command {done.id} ended ({done.status}); "
                                      "its result goes to the model"))
        await self.ctx.inject([ChatMessage(role="system", content="\n\n".join(note(d, limit) for d in finished),
                                           run_id=self.ctx.request.run_id)])
        self._quiet_from = len(turn) if check.running == 0 else None

    async def after_turn(self, stop_reason: str) -> None:
        background = self.ctx.agent.background
        if stop_reason != "cancelled" or background is None or not self._offered():
            return
        stopped = await background.stop(self.ctx.request.session_id)
        if stopped:
            log.info("background commands stopped with the cancelled turn", count=stopped)
