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
same moment by a person with `agentmesh tools run` is collected at the next turn's start.)

The first step's ask is made in `load`, beside the turn's start (StartTurn), rather than after
it, so it adds no wait before the first model call — and only for a session the tools service
may hold background state for: it streams which sessions have some (WatchBackground,
background_sessions.py), so a turn in a session without background commands makes no such call
(while that stream is open; without it, every turn asks). What it collected is shown at step 1; a turn
that ends before any step (a rejected plan, a failure) persists it as the same system message,
so the next turn's history has it: a result is handed over once and never dropped."""

from __future__ import annotations

from agentmesh.agent.capabilities.subagents import DELEGATE_TASK
from agentmesh.agent.loop.context import clip
from agentmesh.agent.loop.ports import BackgroundCheck
from agentmesh.agent.loop.turn import Capability
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
    # The first step's answer, asked for in `load`; None once used (or when the ask failed).
    _first: BackgroundCheck | None = None

    def _offered(self) -> bool:
        return self.ctx.agent.background is not None and any(t.name == BACKGROUND_RUN for t in self.ctx.tools)

    async def load(self) -> None:
        background = self.ctx.agent.background
        if background is None:
            return
        if not background.may_have(self.ctx.request.session_id):
            # Nothing runs and nothing waits to be collected: quiet until the model starts one.
            self._quiet_from = 0
            return
        try:
            self._first = await background.take_finished(self.ctx.request.session_id)
        except AgentmeshError as exc:
            log.warning("background results unavailable", error=exc.message)

    async def before_step(self, step: int, turn: list[ChatMessage]) -> None:
        background = self.ctx.agent.background
        first, self._first = self._first, None
        if background is None or (not self._offered() and not (first and first.finished)):
            return
        if first is not None:
            check = first
        else:
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
        for done in finished:
            self.ctx.emit(BackgroundResultEvent(done))
            self.ctx.emit(StatusEvent(f"background command {done.id} ended ({done.status}); "
                                      "its result goes to the model"))
        await self.ctx.inject([self._message(finished)])
        self._quiet_from = len(turn) if check.running == 0 else None

    def _message(self, finished: list[BackgroundDone]) -> ChatMessage:
        limit = self.ctx.settings.tool_output_chars
        return ChatMessage(role="system", content="\n\n".join(note(d, limit) for d in finished),
                           run_id=self.ctx.request.run_id)

    async def after_turn(self, stop_reason: str) -> None:
        first, self._first = self._first, None
        if first is not None and first.finished:
            # Collected at the start, but the turn ended before its first step: keep them for the next.
            await self.ctx.persist([self._message(first.finished)])
        background = self.ctx.agent.background
        if stop_reason != "cancelled" or background is None or not self._offered():
            return
        stopped = await background.stop(self.ctx.request.session_id)
        if stopped:
            log.info("background commands stopped with the cancelled turn", count=stopped)
