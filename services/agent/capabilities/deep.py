"""Run modes: the default loop, and deep work (`ChatOptions.mode == "deep"`).

Deep work is the same loop with three additions, all visible in the stream and the transcript:

1. **A plan first.** Before the first step, one tool-less model call asks for a short numbered
   plan. The plan is persisted (an assistant message) and pinned at the top of this turn's
   context — right after the user's message — for every later call, so it survives the
   trimming of old tool outputs.
2. **Reflection.** Every `deep_reflect_every` steps, one more tool-less call asks the model to
   compare the progress with the plan and write the revised plan, which replaces the pinned one
   (and is persisted too).
3. **A larger step budget** (`deep_max_iterations`, still capped by `max_iterations_cap`; a
   turn's own `max_iterations` wins), progress as status events ("step 9 of 50 — reflecting
   on the plan"), and the `delegate_task` tool (subagents.py).

With the task board (task_tools.py, on in deep mode by default) the plan *becomes the board*:
each numbered item is a task, the board (not the plan's text) is pinned in every call, the
model keeps it current with `task_update`, a reflection reviews the board, and a text-only reply
while tasks are still open gets a nudge to go on (at most `deep_nudges` per turn). A session that
already has open tasks continues with its board instead of planning again.

Planning and reflection calls are model calls: they count in `iterations` and `usage`, not in
the step budget, which counts tool-using calls as in the default mode.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from agentmesh.agent.capabilities.task_tools import TaskBoard
from agentmesh.agent.loop.turn import Capability, Nudge, TurnContext, Verdict
from agentmesh.agent.types import ChatMessage, ModelReply, StatusEvent

if TYPE_CHECKING:
    pass


PLAN_INSTRUCTION = (
    "Deep work mode: you have up to {steps} tool-using steps for this task. Before you act, write a short numbered "
    "plan (at most 8 steps) of how you will do it; independent parts may be delegated to sub-agents. Reply with the "
    "plan only. Do not call any tools now."
)
REFLECT_INSTRUCTION = (
    "Reflection after step {done} of {steps}: compare what has been done so far with your plan. Reply with the "
    "revised numbered plan only: mark finished steps [done], drop steps that are no longer needed, add what is "
    "missing. Do not call any tools now."
)
REFLECT_BOARD_INSTRUCTION = (
    "Reflection after step {done} of {steps}: compare what has been done so far with the task board. Reply briefly: "
    "what is finished, what is left, what should change. Do not call any tools now; in your next steps, bring the "
    "board up to date with task_update and task_create."
)
PINNED_PLAN = "Your plan for this task (revise it when asked to reflect):\n{plan}"
PINNED_BOARD = (
    "Your task board — the plan for this work. Keep it current: task_update to mark a task in_progress when you "
    "start it and done when it is finished, task_create for new work, cancelled for what is no longer needed.\n"
    "{board}"
)
PINNED_REFLECTION = "Your latest reflection (after step {done}):\n{text}"
NUDGE = (
    "You replied without calling a tool, but tasks on your board are still open:\n{open}\nCarry on with them. If "
    "they are finished or no longer needed, mark them done or cancelled with task_update, then give your answer."
)
REFLECTION_HEADING = "Reflection (after step {done}):"
PLAN_HEADING = "Plan:"
REVISED_HEADING = "Revised plan (after step {done}):"
_NUMBERED = re.compile(r"^\s*\d+[.)]\s", re.MULTILINE)
_ITEM = re.compile(r"^\s*\d+[.)]\s+(.+?)\s*$", re.MULTILINE)


def plan_items(plan: str) -> list[str]:
    """The numbered items of a plan, without their numbers or markdown emphasis."""
    return [item.replace("**", "").strip() for item in _ITEM.findall(plan) if item.strip()]


class DeepWork(Capability):
    """Plan first, reflect every `deep_reflect_every` steps, pin the plan (or the task board) in
    every call's view, nudge a model that stops while tasks are open."""

    def __init__(self, ctx: TurnContext, board: TaskBoard | None = None):
        super().__init__(ctx)
        self.board = board
        self.plan = ""
        self.reflection = ""
        self.reflected_after = 0
        self.reflections = 0
        self.nudges = 0

    async def before_first_call(self, turn: list[ChatMessage]) -> None:
        steps = self.ctx.step_budget
        if self.board is not None and self.board.board.open_tasks():
            count = len(self.board.board.open_tasks())
            self.ctx.emit(StatusEvent(f"deep work: continuing with the task board ({count} open "
                                      f"{'task' if count == 1 else 'tasks'}; up to {steps} steps)"))
            return
        self.ctx.emit(StatusEvent(f"deep work: planning before acting (up to {steps} steps)"))
        plan = await self._ask(turn, PLAN_INSTRUCTION.format(steps=steps), PLAN_HEADING)
        if not plan:
            self.ctx.emit(StatusEvent("the model wrote no plan; continuing without one"))
            return
        self.plan = plan
        count = len(_NUMBERED.findall(plan))
        self.ctx.emit(StatusEvent(f"plan ready ({count} steps)" if count else "plan ready"))
        items = plan_items(plan)
        if self.board is not None and items:
            await self.board.add_plan(items)

    async def before_step(self, step: int, turn: list[ChatMessage]) -> None:
        steps, every = self.ctx.step_budget, self.ctx.settings.deep_reflect_every
        due = every > 0 and step > 1 and (step - 1) % every == 0
        self.ctx.emit(StatusEvent(f"step {step} of {steps}" + (" — reflecting on the plan" if due else "")))
        if not due:
            return
        self.reflections += 1
        done = step - 1
        if self._board_in_use():
            text = await self._ask(turn, REFLECT_BOARD_INSTRUCTION.format(done=done, steps=steps),
                                   REFLECTION_HEADING.format(done=done))
            if text:
                self.reflection, self.reflected_after = text, done
        else:
            text = await self._ask(turn, REFLECT_INSTRUCTION.format(done=done, steps=steps),
                                   REVISED_HEADING.format(done=done))
            if text:
                self.plan = text

    def view(self, messages: list[ChatMessage]) -> list[ChatMessage]:
        if not messages:
            return messages
        if self._board_in_use():
            assert self.board is not None
            pinned = PINNED_BOARD.format(board=self.board.board.render())
            if self.reflection:
                pinned += "\n\n" + PINNED_REFLECTION.format(done=self.reflected_after, text=self.reflection)
        elif self.plan:
            pinned = PINNED_PLAN.format(plan=self.plan)
        else:
            return messages
        return [messages[0], ChatMessage(role="system", content=pinned), *messages[1:]]

    async def after_reply(self, step: int, reply: ModelReply, turn: list[ChatMessage]) -> Verdict:
        if reply.tool_calls or not self._board_in_use() or self.nudges >= self.ctx.settings.deep_nudges:
            return None
        assert self.board is not None
        still_open = self.board.board.open_tasks()
        if not still_open:
            return None
        self.nudges += 1
        self.ctx.emit(StatusEvent(f"{len(still_open)} open {'task' if len(still_open) == 1 else 'tasks'} left; "
                                  f"asking the model to carry on (nudge {self.nudges} of "
                                  f"{self.ctx.settings.deep_nudges})"))
        return Nudge(NUDGE.format(open="\n".join(self.board.board.line(t) for t in still_open)))

    def _board_in_use(self) -> bool:
        return self.board is not None and bool(self.board.board.tasks)

    async def _ask(self, turn: list[ChatMessage], instruction: str, heading: str) -> str:
        """One tool-less call; its text is persisted under `heading`. Empty when the model said nothing."""
        note = ChatMessage(role="system", content=instruction)
        reply = await self.ctx.call_model(turn, extra=[note], allow_tools=False)
        text = reply.text.strip()
        if text:
            await self.ctx.persist([ChatMessage(role="assistant", content=f"{heading}\n{text}",
                                                run_id=self.ctx.request.run_id)])
        return text
