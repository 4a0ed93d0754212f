"""The agent's own tools, as `agentmesh.toolpolicy.AGENT_TOOLS` names them for the gateway (which
checks a tool policy's names against them and the tools service's catalog, and which no self-made
tool may be named after): the two lists may not drift."""

from __future__ import annotations

from agentmesh.agent.capabilities import (
    memory_tools,
    promoted_tools,
    skills,
    subagents,
    task_tools,
    team_board,
    team_specs,
    thinking,
)
from agentmesh.toolpolicy import AGENT_TOOLS


def test_the_gateway_knows_every_tool_the_agent_runs_itself():
    own = {memory_tools.MEMORY_SAVE.name, memory_tools.MEMORY_SEARCH.name, subagents.DELEGATE_TASK, thinking.THINK,
           skills.READ_SKILL, promoted_tools.PROMOTE, *(spec.name for spec in task_tools.SPECS),
           *(spec.name for spec in (*team_specs.LEAD_SPECS, *team_specs.MATE_SPECS, team_board.CLAIM))}
    assert own == AGENT_TOOLS


def test_the_read_only_marks_of_the_agents_own_tools():
    read_only = {spec.name for spec in (memory_tools.MEMORY_SAVE, memory_tools.MEMORY_SEARCH, thinking.THINK_SPEC,
                                        *task_tools.SPECS) if spec.read_only}
    assert read_only == {"memory_search", "think", "task_get", "task_list"}
