"""A turn that opens its session: what the gateway used to resolve before calling the agent.

The gateway no longer reads the session before a turn (a memory round trip on every turn's
critical path). It sends the session to create when missing and the deployment's settings
(`SessionToOpen`); the turn's StartTurn puts the session and reads its namespace's settings in
the same call (turn_start.py), and `resolve` makes of them what the gateway made before:

- the model: the turn's, else the session's when the deployment knows it, else the default;
- the permission mode: the turn's, else the session's, else the deployment's;
- the tool policies: the deployment's, the namespace's and the session's layers (then the
  turn's own), and the namespace's mcp_servers_version.

Plain Python; the rules themselves are `agentmesh.toolpolicy`'s, shared with the gateway.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Container

from agentmesh.models import ModelSpec
from agentmesh.toolpolicy import ToolPolicy, permission_mode_of, session_layers

if TYPE_CHECKING:  # the loop imports this module
    from agentmesh.agent.loop.turn_request import TurnRequest

__all__ = ["NamedAgent", "OpenedSession", "SessionToOpen", "resolve"]


@dataclass(frozen=True)
class SessionToOpen:
    """The session the gateway would have created (its id and namespace are the turn's) and the
    deployment's layers of the turn's settings."""

    title: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    created_at: float = 0.0  # 0: when memory creates it
    deployment_tools: ToolPolicy = field(default_factory=ToolPolicy)
    deployment_permission_mode: str = ""
    agent: str = ""  # ChatOptions.agent: "NAME" or "NAME@VERSION" (docs/agents.md); memory resolves it


@dataclass(frozen=True)
class NamedAgent:
    """A named agent's version as StartTurn resolved it: what of it applies to the turn."""

    name: str
    version: int
    instructions: str
    description: str = ""
    sub_agents: tuple[str, ...] = ()  # agents it may delegate to, offered as tools (subagents.py)
    model: str = ""
    tools: ToolPolicy = field(default_factory=ToolPolicy)
    permission_mode: str = ""
    approvals: frozenset[str] = frozenset()
    max_steps: int = 0
    token_budget: int = 0
    # The namespace's skills its turns see (empty: every active one), capabilities/skills.py.
    skills: tuple[str, ...] = ()
    # The namespace's MCP servers whose tools its turns are offered (empty: every one), run.py.
    mcp_servers: tuple[str, ...] = ()
    # Sampling parameters for every model call of its turns, over the catalogue model's; None: those.
    temperature: float | None = None
    top_p: float | None = None
    # The sandbox its command tools run in: a template name over the namespace's, and "call" |
    # "session" over the template's isolation ("": not chosen).
    sandbox_template: str = ""
    isolation: str = ""


@dataclass(frozen=True)
class OpenedSession:
    """The session as stored once the turn's start put it, and its namespace's settings."""

    namespace: str
    created: bool  # this turn created it
    model: str = ""
    permission_mode: str = ""
    tools: ToolPolicy = field(default_factory=ToolPolicy)  # the session's own layer
    namespace_tools: ToolPolicy = field(default_factory=ToolPolicy)
    mcp_servers_version: float | None = None  # None: not read
    agent: NamedAgent | None = None  # the named agent the turn asked for
    namespace_sandbox_template: str = ""  # "": the deployment's default
    sandbox_template: str = ""  # the session's own, over the namespace's
    record_model_calls: bool = False  # the session's own switch (the deployment's is a setting)
    namespace_models: tuple[ModelSpec, ...] = ()  # the namespace's own models (ModelConfig resources)


def resolve(request: "TurnRequest", opened: OpenedSession, known_models: Container[str]) -> "TurnRequest":
    """`request` with the session's settings applied; it opens nothing more (sub-agents inherit it)."""
    opening = request.opening
    assert opening is not None, "only a turn that opens its session is resolved"
    # Layers go before the turn's own (already in tool_policies): every one must allow a tool.
    layers = session_layers(opening.deployment_tools, opened.namespace_tools, opened.tools)
    # The turn's model, else the named agent's, else the session's (each when the deployment knows it).
    agent_model = opened.agent.model if opened.agent is not None else ""
    own = {m.name for m in opened.namespace_models}
    resolved = dataclasses.replace(
        request,
        namespace=opened.namespace or request.namespace,
        model=request.model or next((m for m in (agent_model, opened.model)
                                            if m and (m in known_models or m in own)), ""),
        permission_mode=permission_mode_of(request.permission_mode, opened.permission_mode,
                                           opening.deployment_permission_mode),
        tool_policies=(*layers, *request.tool_policies),
        mcp_servers_version=opened.mcp_servers_version,
        sandbox_template=request.sandbox_template or opened.sandbox_template or opened.namespace_sandbox_template,
        record_model_calls=request.record_model_calls or opened.record_model_calls,
        namespace_models=opened.namespace_models,
        opening=None,
    )
    return with_agent(resolved, opened.agent) if opened.agent else resolved


def with_agent(request: "TurnRequest", agent: NamedAgent) -> "TurnRequest":
    """`request` running `agent` (its model was chosen by `resolve`): its instructions are the
    system prompt unless the turn sets one, its tool policy is one more layer (every layer must allow a tool, so it
    can only narrow), its approvals add to the turn's, and its budgets tighten the turn's."""

    def tighter(turn: int, agents: int) -> int:
        return min(v for v in (turn, agents) if v) if turn or agents else 0

    return dataclasses.replace(
        request,
        agent=agent,
        system_prompt=request.system_prompt or agent.instructions,
        permission_mode=request.permission_mode if not agent.permission_mode else permission_mode_of(
            "", agent.permission_mode, request.permission_mode),
        approval_tools=request.approval_tools | agent.approvals,
        tool_policies=(*request.tool_policies, agent.tools) if agent.tools.allow or agent.tools.deny
        else request.tool_policies,
        sandbox_template=agent.sandbox_template or request.sandbox_template,
        isolation=agent.isolation or request.isolation,
        max_iterations=tighter(request.max_iterations, agent.max_steps),
        token_budget=tighter(request.token_budget, agent.token_budget),
    )
