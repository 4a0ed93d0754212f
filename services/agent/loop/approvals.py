"""Holding risky tool calls until a person decides (docs/approvals.md).

Two things hold a call: the approval list (`AGENTMESH_AGENT_APPROVAL_TOOLS`, plus whatever a turn
adds; "*" means every tool), which always applies, and the turn's permission mode
(agentmesh.toolpolicy): "auto" adds nothing, "normal" holds every tool not marked read-only,
"manual" every call. A person may approve "the rest of this turn": the calls held then and every
later one of the turn run without asking. A held call is held: the loop emits `approval_request`, waits
here for `decide()` (reached through the same RunTurn stream that carries the turn), and runs
the call only when approved. A denial or a timeout becomes an error result the model reads,
with error_kind "denied", so the model can adapt instead of the turn failing.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from agentmesh.agent.types import ToolCall, ToolOutcome
from agentmesh.toolpolicy import AUTO, MANUAL, NORMAL

EVERY_TOOL = "*"


@dataclass(frozen=True)
class Decision:
    approved: bool
    note: str = ""
    decided_by: str = "user"  # "user" | "timeout"
    # With approved: the arguments a person edited the call to run with ("": the model's).
    arguments_json: str = ""


class ApprovalGate:
    """One per turn: which calls need approval, and the calls now waiting for a decision."""

    def __init__(self, tools: frozenset[str], timeout_s: float, mode: str = AUTO):
        self.tools = tools
        self.timeout_s = timeout_s
        self.mode = mode or AUTO
        # Set by a person's "approve the rest of this turn": nothing more is held.
        self.rest_of_turn_approved = False
        self._pending: dict[str, asyncio.Future[Decision]] = {}

    def needs_approval(self, call: ToolCall, read_only: bool = False) -> bool:
        if self.rest_of_turn_approved:
            return False
        if EVERY_TOOL in self.tools or call.name in self.tools:
            return True
        return self.mode == MANUAL or (self.mode == NORMAL and not read_only)

    @property
    def pending(self) -> list[str]:
        return list(self._pending)

    async def wait(self, call: ToolCall) -> Decision:
        """The decision on `call`; a denial by timeout when none comes in time. Cancelling the
        waiting task (the turn was cancelled) simply drops the call: it never ran."""
        future: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
        self._pending[call.call_id] = future
        try:
            return await asyncio.wait_for(future, self.timeout_s)
        except TimeoutError:
            return Decision(approved=False, decided_by="timeout")
        finally:
            if self._pending.get(call.call_id) is future:
                del self._pending[call.call_id]

    def decide(self, call_id: str, approved: bool, note: str = "", rest_of_turn: bool = False,
               arguments_json: str = "") -> bool:
        """Record a person's decision; False when no call with that id is waiting (any more).
        `rest_of_turn` with an approval lets the other held calls and every later one run too;
        `arguments_json` with an approval runs the call with those arguments instead."""
        future = self._pending.get(call_id)
        if future is None or future.done():
            return False
        future.set_result(Decision(approved=approved, note=note, decided_by="user",
                                   arguments_json=arguments_json if approved else ""))
        if approved and rest_of_turn:
            self.rest_of_turn_approved = True
            for other in self._pending.values():
                if not other.done():
                    other.set_result(Decision(approved=True, note="approved with the rest of the turn", decided_by="user"))
        return True

    def denial(self, call: ToolCall, decision: Decision) -> ToolOutcome:
        """The result the model sees for a call that was not allowed to run."""
        if decision.decided_by == "timeout":
            reason = f"no decision within {self.timeout_s:g} s"
        else:
            reason = "denied by the user" + (f": {decision.note}" if decision.note else "")
        return ToolOutcome.error(call, "denied", f"error: {call.name} was not run: {reason}")

    @staticmethod
    def edited(call: ToolCall, decision: Decision) -> ToolCall:
        """The call as it runs: with the person's arguments when they edited them."""
        if not decision.arguments_json or decision.arguments_json == call.arguments_json:
            return call
        return ToolCall(call_id=call.call_id, name=call.name, arguments_json=decision.arguments_json)

    @staticmethod
    def record_edit(outcome: ToolOutcome, call: ToolCall) -> ToolOutcome:
        """A result of a call run with edited arguments says so first: the transcript (and the
        model, which asked for other arguments) see what ran."""
        outcome.output = (f"[the user edited the arguments before approving; {call.name} ran with "
                          f"{call.arguments_json}]\n{outcome.output}")
        return outcome
