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

Planning and reflection calls are model calls: they count in `iterations` and `usage`, not in
the step budget, which counts tool-using calls as in the default mode.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from agentmesh.agent.ports import MemoryHit
from agentmesh.agent.settings import AgentSettings
from agentmesh.agent.types import ChatMessage, StatusEvent, ToolSpec
from agentmesh.modes import DEEP

if TYPE_CHECKING:
    from agentmesh.agent.loop import TurnRequest, TurnRun


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
PINNED_PLAN = "Your plan for this task (revise it when asked to reflect):\n{plan}"
PLAN_HEADING = "Plan:"
REVISED_HEADING = "Revised plan (after step {done}):"
_NUMBERED = re.compile(r"^\s*\d+[.)]\s", re.MULTILINE)


def step_budget(request: "TurnRequest", settings: AgentSettings) -> int:
    """Tool-using model calls the turn may make."""
    if request.max_iterations:
        return request.max_iterations
    if request.mode == DEEP:
        return min(settings.deep_max_iterations, settings.max_iterations_cap)
    return settings.max_iterations


def work_for(run: "TurnRun", history: list[ChatMessage], tools: list[ToolSpec], memories: list[MemoryHit]) -> "Work":
    cls = DeepWork if run.request.mode == DEEP else Work
    return cls(run, history, tools, memories)


class Work:
    """The default mode: hooks that do nothing."""

    def __init__(self, run: "TurnRun", history: list[ChatMessage], tools: list[ToolSpec], memories: list[MemoryHit]):
        self.run = run
        self.history = history
        self.tools = tools
        self.memories = memories

    async def start(self, turn: list[ChatMessage]) -> None:
        """Before the first step."""

    async def before_step(self, step: int, turn: list[ChatMessage]) -> None:
        """Before tool-using step `step` (from 1)."""

    def view(self, turn: list[ChatMessage]) -> list[ChatMessage]:
        """This turn's messages as the model should see them."""
        return turn


class DeepWork(Work):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.plan = ""
        self.reflections = 0

    async def start(self, turn: list[ChatMessage]) -> None:
        steps = self.run.max_iterations
        self.run._emit(StatusEvent(f"deep work: planning before acting (up to {steps} steps)"))
        plan = await self._ask(turn, PLAN_INSTRUCTION.format(steps=steps), PLAN_HEADING)
        if plan:
            count = len(_NUMBERED.findall(plan))
            self.run._emit(StatusEvent(f"plan ready ({count} steps)" if count else "plan ready"))
        else:
            self.run._emit(StatusEvent("the model wrote no plan; continuing without one"))

    async def before_step(self, step: int, turn: list[ChatMessage]) -> None:
        steps, every = self.run.max_iterations, self.run.settings.deep_reflect_every
        due = every > 0 and step > 1 and (step - 1) % every == 0
        self.run._emit(StatusEvent(f"step {step} of {steps}" + (" — reflecting on the plan" if due else "")))
        if due:
            self.reflections += 1
            done = step - 1
            await self._ask(turn, REFLECT_INSTRUCTION.format(done=done, steps=steps), REVISED_HEADING.format(done=done))

    def view(self, turn: list[ChatMessage]) -> list[ChatMessage]:
        if not self.plan or not turn:
            return turn
        return [turn[0], ChatMessage(role="system", content=PINNED_PLAN.format(plan=self.plan)), *turn[1:]]

    async def _ask(self, turn: list[ChatMessage], instruction: str, heading: str) -> str:
        """One tool-less call; its text becomes the pinned plan and is persisted. An empty answer
        keeps the plan there was."""
        run = self.run
        note = ChatMessage(role="system", content=instruction)
        reply = await run._call_model(self.history, [*self.view(turn), note], self.tools, self.memories,
                                      allow_tools=False)
        text = reply.text.strip()
        if text:
            self.plan = text
            await run._persist([ChatMessage(role="assistant", content=f"{heading}\n{text}", run_id=run.request.run_id)])
        return text
