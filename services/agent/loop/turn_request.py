"""What one turn is asked to do: the message, the session, and the options the gateway (or a
parent turn, for a sub-agent) resolved for it. The loop (loop.py) runs it."""

from __future__ import annotations

from dataclasses import dataclass

from agentmesh.agent.capabilities.subagents import SubagentLink
from agentmesh.agent.loop.session_open import SessionToOpen
from agentmesh.toolpolicy import ToolPolicy

__all__ = ["TurnRequest"]


@dataclass(frozen=True)
class TurnRequest:
    session_id: str
    run_id: str
    message: str
    namespace: str = "default"
    max_iterations: int = 0  # 0: the configured default
    model: str = ""  # "": the configured model
    system_prompt: str = ""  # "": the configured prompt
    # Tools that need approval in this turn on top of the configured ones.
    approval_tools: frozenset[str] = frozenset()
    mode: str = ""  # "" | "default" | "deep" (deep.py)
    plan: bool = False  # plan mode (plan_mode.py): a person approves the plan before anything runs
    plan_auto_approve: bool = False  # ... or nobody is asked (scheduled runs)
    # Token budgets (budget.py); 0: the configured one. They can only tighten the configured ones.
    token_budget: int = 0
    session_token_budget: int = 0
    subagent: SubagentLink | None = None  # set on a sub-agent's turn (subagents.py)
    # Which calls are held ("auto" | "normal" | "manual", approvals.py) and which tools are offered
    # at all (every policy must allow a tool); sub-agents inherit both.
    permission_mode: str = ""
    tool_policies: tuple[ToolPolicy, ...] = ()
    # The namespace's mcp_servers_version as the gateway read it (None: not known), passed to the
    # tools service so that a replica which has that version reads nothing more.
    mcp_servers_version: float | None = None
    # Set on a turn whose session the gateway did not read: its start opens it, and the fields
    # above are resolved from it (session_open.py) before the first model call.
    opening: SessionToOpen | None = None
