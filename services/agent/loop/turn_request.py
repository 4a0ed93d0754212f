"""What one turn is asked to do: the message, the session, and the options the gateway (or a
parent turn, for a sub-agent) resolved for it. The loop (run.py) runs it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentmesh.agent.loop.images import GivenImage
from agentmesh.agent.loop.session_open import NamedAgent, SessionToOpen
from agentmesh.agent.settings import AgentSettings
from agentmesh.models import ModelSpec
from agentmesh.modes import DEEP
from agentmesh.toolpolicy import ToolPolicy

__all__ = ["SubagentLink", "TurnRequest", "agent_name", "span_attributes", "step_budget", "workspace_of"]


@dataclass(frozen=True)
class SubagentLink:
    """What makes a turn a sub-agent's: who delegated it and where its tools work."""

    parent_session_id: str
    workspace_id: str  # the top-level session's id: every sub-agent shares its workspace
    depth: int  # 1 for a child of a top-level turn
    index: int  # 1, 2, ... within the parent turn
    label: str  # "sub-agent 1 (research the API)"


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
    # Compact the conversation before this turn whatever its size (ChatOptions.compact, the
    # REPL's /compact), keeping in detail what `compact_focus` names.
    compact: bool = False
    compact_focus: str = ""
    # The user's images (loop/images.py): stored in the workspace before the message is.
    images: tuple[GivenImage, ...] = ()
    # The named agent the turn runs (session_open.with_agent applied it); None: none.
    agent: NamedAgent | None = None
    # The sandbox template command tools run in (the named agent's, else the namespace's; "":
    # the deployment's default) and an isolation over the template's ("": its own); the tools
    # service checks the name on each call.
    sandbox_template: str = ""
    isolation: str = ""
    # The session records its model calls' payloads (Session.record_model_calls), as the
    # deployment's AGENTMESH_AGENT_RECORD_MODEL_CALLS does for every session; sub-agents inherit it.
    record_model_calls: bool = False
    # The session's namespace's own models (ModelConfig resources, docs/agents.md), which its
    # turns and sub-agents may name beside the deployment's; their providers: Agent.models_for.
    namespace_models: tuple[ModelSpec, ...] = ()


def step_budget(request: TurnRequest, settings: AgentSettings) -> int:
    """Tool-using model calls the turn may make."""
    if request.max_iterations:
        return request.max_iterations
    if request.mode == DEEP:
        return min(settings.deep_max_iterations, settings.max_iterations_cap)
    return settings.max_iterations


def workspace_of(request: TurnRequest) -> str:
    """The session whose workspace the turn's tool calls use: a sub-agent works in its root's."""
    return request.subagent.workspace_id if request.subagent else request.session_id


def agent_name(base: str, request: TurnRequest) -> str:
    return f"{base}/sub-agent" if request.subagent else base


def span_attributes(request: TurnRequest) -> dict[str, Any]:
    link = request.subagent
    if link is None:
        return {}
    return {"agentmesh.subagent.depth": link.depth, "agentmesh.subagent.parent_session_id": link.parent_session_id}
