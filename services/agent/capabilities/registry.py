"""Which capabilities a turn gets, in the order their hooks run. Adding a capability means a
class in its own module (see loop/turn.py, the seam) and one line here.

The loop imports no capability: whoever composes the agent hands it `for_turn`
(`Agent(..., capabilities=for_turn)`, in server.py's `build`)."""

from __future__ import annotations

from typing import cast

from agentmesh.agent.capabilities import (
    background,
    budget,
    compaction,
    deep,
    guards,
    instructions,
    memory_tools,
    plan_mode,
    promoted_tools,
    recall_tools,
    reflection,
    skills,
    subagents,
    task_tools,
    thinking,
)
from agentmesh.agent.capabilities.learning import LearningSources
from agentmesh.agent.capabilities.team_board import SharedTaskBoard
from agentmesh.agent.capabilities.team_store import LEAD, Team, TeamServices, team_of
from agentmesh.agent.capabilities.teams import TeamLead, Teammate
from agentmesh.agent.loop.turn import Capability, TurnContext
from agentmesh.models import DEFAULT_MODEL
from agentmesh.modes import DEEP


def for_turn(ctx: TurnContext, teams: TeamServices | None = None) -> list[Capability]:
    request, settings = ctx.request, ctx.settings
    found: list[Capability] = []
    # The agent's LearningSources, as the turn's start serves them (learning.py).
    learning = cast("LearningSources | None", ctx.learning)
    if learning is not None and learning.instructions is not None:
        # First: its section must be in place before any capability's first model call.
        found.append(instructions.StandingInstructions(ctx, learning.instructions))
    if learning is not None and learning.skills is not None:
        found.append(skills.Skills(ctx, learning.skills))
    if learning is not None and learning.promoted_tools is not None:
        found.append(promoted_tools.PromotedTools(ctx, learning.promoted_tools))
    if settings.compaction:
        found.append(compaction.Compaction(ctx))
    if budget.applies(ctx):
        found.append(budget.TokenBudget(ctx))
    if ctx.agent.background is not None and request.subagent is None:
        found.append(background.BackgroundResults(ctx))
    if ctx.agent.memory is not None:
        found.append(reflection.RecalledLearnings(ctx))
    if ctx.agent.memory is not None:
        found.append(memory_tools.MemoryToolsCapability(ctx, memory_tools.MemoryTools(ctx.agent.memory)))
    if isinstance(ctx.agent.memory, recall_tools.RecallSource) and request.subagent is None:
        # Earlier conversations and the memory blocks: the main agent's, not a delegated task's.
        found.append(recall_tools.RecallTools(ctx, ctx.agent.memory))
    if settings.think_tool:
        found.append(thinking.ThinkTool(ctx))
    # The board and delegation crowd a small window; deep work and plan mode need the board.
    roomy = window_of(ctx) >= settings.reach_min_window or request.mode == DEEP
    wants_board = request.plan or (roomy and (request.mode or "default") in settings.task_modes)
    board = task_tools.TaskBoard(ctx) if wants_board else None
    team: list[Capability] = []
    if teams is not None and settings.teams and request.subagent is None:
        # A teammate's turn (its session says whose), or a lead's: both share the team's board.
        link = team_of(request.session_id)
        if link is not None:
            board = SharedTaskBoard(ctx, Team(teams.store, request.namespace, link[0]), link[1])
            team.append(Teammate(ctx, board.team, link[1], board, teams.runs))
        elif board is not None:
            board = SharedTaskBoard(ctx, Team(teams.store, request.namespace, request.session_id), LEAD)
            team.append(TeamLead(ctx, board.team, board, teams.runs))
    if board is not None:
        found.append(board)
    found.extend(team)
    if roomy and subagents.offered(request, settings):
        found.append(subagents.Delegation(ctx, board))
    if board is not None and request.plan:
        found.append(plan_mode.PlanMode(ctx, board, pins_board=request.mode != DEEP))
    if request.mode == DEEP:
        found.append(deep.DeepWork(ctx, board))
    if settings.keep_tool_results:
        found.append(guards.ToolOutputTrim(ctx))
    if settings.wrap_up_steps:
        found.append(guards.WrapUp(ctx))
    if settings.repeat_limit >= 2:
        found.append(guards.RepeatGuard(ctx))
    return found


def window_of(ctx: TurnContext) -> int:
    """The context window of the model the turn asks for (a catalogue name; else the default's)."""
    named = ctx.agent.models.get(ctx.request.model or DEFAULT_MODEL) or ctx.agent.models[DEFAULT_MODEL]
    return named.context_window or ctx.settings.context_window
