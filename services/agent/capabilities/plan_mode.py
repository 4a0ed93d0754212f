"""Plan mode (`ChatOptions.plan`, `agentmesh chat --plan`): nothing runs before a person approves
the plan.

Before the first step the model writes a numbered plan (one tool-less call); its items become
tasks on the session's board, and the plan is held for approval through the approval flow every
held tool call uses: an `approval_request` for the call `approve_plan` (arguments: the plan),
decided with `Gateway.Approve` / `agentmesh approvals approve|deny` or at the `chat` prompt.
Approved: the turn executes it, the board pinned in every call. Denied with a note: the model
revises the plan with the note in hand (its earlier plan's open tasks are cancelled) and asks
again, at most `plan_revisions` times. Denied past that, or no decision in time: the turn ends
with `stop_reason: "plan_rejected"` and nothing has run. `ChatOptions.plan_auto_approve` (a
scheduled run with nobody to ask) approves at once, with `decided_by: "auto"`.
"""

from __future__ import annotations

import json

from agentmesh.agent.capabilities.deep import plan_items
from agentmesh.agent.capabilities.task_tools import TaskBoard
from agentmesh.agent.loop.approvals import Decision
from agentmesh.agent.loop.turn import Capability, Stop, TurnContext
from agentmesh.agent.types import ApprovalRequestEvent, ApprovalResolvedEvent, ChatMessage, StatusEvent, ToolCall

APPROVE_PLAN = "approve_plan"
INSTRUCTION = (
    "Plan mode: nothing may run until a person approves your plan. Write a short numbered plan (at most 10 steps, "
    "one line each) of how you will do this task. Reply with the plan only. Do not call any tools now."
)
REVISE = (
    "The person did not approve your plan{because}. Write a revised numbered plan that takes this into account. "
    "Reply with the plan only. Do not call any tools now."
)
APPROVED_NOTE = (
    "The person approved your plan; it is on your task board below. Carry it out now, keeping the board current "
    "(task_update: in_progress when you start a task, done when it is finished).\n{board}"
)
PLAN_HEADING = "Plan (awaiting approval):"
REJECTED = "The plan was not approved ({why}); nothing was run."


class PlanMode(Capability):
    def __init__(self, ctx: TurnContext, board: TaskBoard, *, pins_board: bool):
        super().__init__(ctx)
        self.board = board
        self.pins_board = pins_board  # deep work pins the board itself
        self.approved = False

    async def before_first_call(self, turn: list[ChatMessage]) -> Stop | None:
        ctx = self.ctx
        limit = ctx.settings.plan_revisions
        instruction = INSTRUCTION
        mine: list[int] = []
        for attempt in range(1, limit + 2):
            reply = await ctx.call_model(turn, extra=[ChatMessage(role="system", content=instruction)])
            plan = reply.text.strip()
            items = plan_items(plan) or ([plan] if plan else [])
            if not items:
                return Stop("plan_rejected", REJECTED.format(why="the model wrote no plan"))
            await ctx.persist([ChatMessage(role="assistant", content=f"{PLAN_HEADING}\n{plan}", run_id=ctx.request.run_id)])
            for task_id in mine:  # a revision replaces the plan before it
                if self.board.board.tasks[task_id].status in ("pending", "in_progress"):
                    self.board.board.update(task_id, status="cancelled")
            first_new = self.board.board.next_id
            await self.board.add_plan(items)
            mine = list(range(first_new, self.board.board.next_id))
            decision = await self._decide(attempt, plan)
            if decision.approved:
                self.approved = True
                ctx.emit(StatusEvent(f"plan approved ({len(items)} steps); carrying it out"))
                return None
            if decision.decided_by == "timeout":
                return Stop("plan_rejected", REJECTED.format(why=f"no decision within {ctx.approvals.timeout_s:g} s"))
            because = f": {decision.note}" if decision.note else ""
            if attempt > limit:
                return Stop("plan_rejected", REJECTED.format(why=f"denied {attempt} times{because}"))
            ctx.emit(StatusEvent(f"plan denied{because}; revising it ({attempt} of at most {limit} revisions)"))
            instruction = REVISE.format(because=because)
        return None  # not reached

    async def _decide(self, attempt: int, plan: str) -> Decision:
        ctx = self.ctx
        call = ToolCall(call_id=f"{ctx.request.run_id}.plan-{attempt}", name=APPROVE_PLAN,
                        arguments_json=json.dumps({"plan": plan}))
        ctx.emit(ApprovalRequestEvent(call, ctx.approvals.timeout_s))
        if ctx.request.plan_auto_approve:
            decision = Decision(approved=True, decided_by="auto")
        else:
            decision = await ctx.approvals.wait(call)
        ctx.emit(ApprovalResolvedEvent(call, decision.approved, decision.note, decision.decided_by))
        return decision

    def view(self, messages: list[ChatMessage]) -> list[ChatMessage]:
        if not (self.approved and self.pins_board and messages):
            return messages
        pinned = APPROVED_NOTE.format(board=self.board.board.render())
        return [messages[0], ChatMessage(role="system", content=pinned), *messages[1:]]
