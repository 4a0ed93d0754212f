"""Running one reply's tool calls: concurrently, each behind the approval gate when the policy
says so, each under an `execute_tool` span; results are persisted and then streamed out as they
finish, and go back to the model in call order. A cancel closes the step in the transcript
(every call gets a result), so the next turn replays cleanly.

The step's last result is handed back unsaved: it is saved (`save`) beside the next model call,
which needs nothing from the write, and shown once saved (show_after_save.py)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Awaitable, Callable, Sequence

from opentelemetry.trace import SpanKind, Status, StatusCode

from agentmesh.agent.loop.approvals import ApprovalGate
from agentmesh.agent.settings import AgentSettings
from agentmesh.agent.types import (
    ApprovalRequestEvent,
    ApprovalResolvedEvent,
    ChatMessage,
    RunEvent,
    ToolCall,
    ToolCallEvent,
    ToolOutcome,
    ToolResultEvent,
    tool_message,
)
from agentmesh.errors import AgentmeshError
from agentmesh.logs import get_logger
from agentmesh.telemetry import Telemetry
from agentmesh.telemetry.genai import ERROR_TYPE, GEN_AI_TOOL_CALL_ID, GEN_AI_TOOL_NAME, execute_tool_span

log = get_logger("agentmesh.agent")

Dispatch = Callable[[ToolCall], Awaitable[ToolOutcome]]
# The result of a call that must not run at all (its tool is turned off, or there is no such
# tool), before anyone is asked about it; None for a call that may go on.
Screen = Callable[[ToolCall], "ToolOutcome | None"]


class ToolCalls:
    """One per turn; `dispatch` routes a call to the capability or the tools service that runs it."""

    def __init__(self, *, run_id: str, settings: AgentSettings, telemetry: Telemetry, approvals: ApprovalGate,
                 emit: Callable[[RunEvent], None], persist: Callable[[list[ChatMessage]], Awaitable[None]],
                 dispatch: Dispatch, screen: Screen = lambda call: None,
                 read_only: Callable[[str], bool] = lambda name: False):
        self.run_id = run_id
        self.settings = settings
        self.telemetry = telemetry
        self.approvals = approvals
        self.emit = emit
        self.persist = persist
        self.dispatch = dispatch
        self.screen = screen
        self.read_only = read_only  # the catalog's read_only mark of a tool, for the permission mode

    async def run(self, calls: tuple[ToolCall, ...]) -> tuple[list[ChatMessage], list[ToolOutcome]]:
        """Run the calls; their results in call order, and the last to finish, neither saved nor
        shown yet (the others are saved and shown as they finish): `save` it, then show it."""
        for call in calls:
            self.emit(ToolCallEvent(call))
        limit = asyncio.Semaphore(self.settings.tool_concurrency)
        cap = self.settings.max_tool_calls
        if len(calls) == 1:  # max_tool_calls is at least 1
            return await self._only(calls[0], limit)
        tasks = [
            asyncio.create_task(self._gated(call, limit) if i < cap else self._refuse(call, cap))
            for i, call in enumerate(calls)
        ]
        saved: set[str] = set()
        left = len(tasks)
        try:
            for finished in asyncio.as_completed(tasks):
                outcome = await finished
                left -= 1
                if not left:
                    break  # the last: saved beside the next model call (show_after_save.py)
                # Saved before it is shown: a result the client saw is never missing from the
                # transcript (if memory stays away, the turn fails without showing it).
                await self.persist([tool_message(outcome, self.run_id)])
                saved.add(outcome.call_id)
                self.emit(ToolResultEvent(outcome))
        except BaseException as exc:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            # After a save memory refused (AgentmeshError), another would only wait out the same deadline.
            if not isinstance(exc, AgentmeshError):
                await self.record_cancelled([c for c in calls if c.call_id not in saved])
            raise
        results = [task.result() for task in tasks]
        return [tool_message(o, self.run_id) for o in results], [outcome]

    async def _only(self, call: ToolCall, limit: asyncio.Semaphore) -> tuple[list[ChatMessage], list[ToolOutcome]]:
        """A reply's only call, run in the turn's own task (the usual reply): what `run` does for
        many calls, without a task to start and wait for — one hop of the event loop fewer."""
        try:
            outcome = await self._gated(call, limit)
        except BaseException as exc:
            if not isinstance(exc, AgentmeshError):
                await self.record_cancelled([call])
            raise
        return [tool_message(outcome, self.run_id)], [outcome]

    async def save(self, outcomes: list[ToolOutcome]) -> None:
        """Save results `run` handed back unsaved."""
        try:
            await self.persist([tool_message(o, self.run_id) for o in outcomes])
        except BaseException as exc:
            # Stopped while saving (cancelled): record the calls as cancelled, as run() does;
            # after a save memory refused (AgentmeshError), another would only wait out the same deadline.
            if not isinstance(exc, AgentmeshError):
                await self.record_cancelled(outcomes)
            raise

    async def record_cancelled(self, calls: "Sequence[ToolCall | ToolOutcome]") -> None:
        """Save a "cancelled" result for each of `calls` (best effort, bounded): the turn was
        stopped before their results were saved, and the transcript must stay replayable."""
        if calls:
            lost = [ToolOutcome.error(c, "cancelled", "error: the run was cancelled before this call finished")
                    for c in calls]
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.persist([tool_message(o, self.run_id) for o in lost]),
                                       self.settings.memory_timeout_s)

    async def not_run(self, calls: tuple[ToolCall, ...], kind: str, text: str) -> None:
        """Record a result for calls the turn will not run, so the transcript stays replayable."""
        outcomes = [ToolOutcome.error(call, kind, text) for call in calls]
        if outcomes:  # saved before shown, as in run()
            await self.persist([tool_message(o, self.run_id) for o in outcomes])
        for outcome in outcomes:
            self.emit(ToolResultEvent(outcome))

    async def _gated(self, call: ToolCall, limit: asyncio.Semaphore) -> ToolOutcome:
        """Run the call, first holding it for a person's decision when the policy says so. The
        wait holds no concurrency slot, so the reply's other calls run meanwhile."""
        refused = self.screen(call)
        if refused is not None:
            return refused
        if self.approvals.needs_approval(call, self.read_only(call.name)):
            attributes = {GEN_AI_TOOL_NAME: call.name, GEN_AI_TOOL_CALL_ID: call.call_id}
            # A span of its own, so a trace shows the time spent waiting for a person.
            with self.telemetry.tracer.start_as_current_span(
                f"await_approval {call.name}", kind=SpanKind.INTERNAL, attributes=attributes,
            ) as span:
                # No await between the event and wait() registering the call: a decision cannot
                # arrive before the call is known to be waiting.
                self.emit(ApprovalRequestEvent(call, self.approvals.timeout_s))
                log.info("tool call waiting for approval", tool=call.name, call_id=call.call_id)
                decision = await self.approvals.wait(call)
                span.set_attributes({"agentmesh.approval.approved": decision.approved,
                                     "agentmesh.approval.decided_by": decision.decided_by})
            log.info("tool call decided", tool=call.name, call_id=call.call_id, approved=decision.approved,
                     decided_by=decision.decided_by)
            ran = self.approvals.edited(call, decision)
            self.emit(ApprovalResolvedEvent(call, decision.approved, decision.note, decision.decided_by,
                                            ran.arguments_json if ran is not call else ""))
            if not decision.approved:
                return self.approvals.denial(call, decision)
            if ran is not call:
                return self.approvals.record_edit(await self._execute(ran, limit), ran)
        return await self._execute(call, limit)

    @staticmethod
    async def _refuse(call: ToolCall, cap: int) -> ToolOutcome:
        return ToolOutcome.error(
            call, "too_many_calls", f"error: not run: at most {cap} tool calls per reply "
            "(AGENTMESH_AGENT_MAX_TOOL_CALLS); make fewer calls at a time"
        )

    async def _execute(self, call: ToolCall, limit: asyncio.Semaphore) -> ToolOutcome:
        async with limit:
            with execute_tool_span(self.telemetry.tracer, name=call.name, call_id=call.call_id) as span, \
                    self.telemetry.metrics.tool_timer(call.name) as timer:
                started = time.monotonic()
                try:
                    outcome = await self.dispatch(call)
                except asyncio.CancelledError:
                    span.set_status(Status(StatusCode.ERROR, "cancelled"))
                    span.set_attribute(ERROR_TYPE, "cancelled")
                    raise
                except Exception as exc:
                    log.exception("tool call failed inside the agent", tool=call.name)
                    outcome = ToolOutcome.error(call, "internal", f"error: {call.name} failed inside the agent: {exc}")
                outcome.call_id, outcome.name = call.call_id, call.name
                if not outcome.duration_ms:
                    outcome.duration_ms = (time.monotonic() - started) * 1000
                if outcome.is_error:
                    kind = outcome.error_kind or "error"
                    span.set_status(Status(StatusCode.ERROR, kind))
                    span.set_attribute(ERROR_TYPE, kind)
                    timer.outcome = kind if kind in ("timeout", "cancelled") else "error"
                return outcome
