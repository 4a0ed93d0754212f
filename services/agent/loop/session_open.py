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

from agentmesh.toolpolicy import ToolPolicy, permission_mode_of, session_layers

if TYPE_CHECKING:  # the loop imports this module
    from agentmesh.agent.loop.turn_request import TurnRequest

__all__ = ["OpenedSession", "SessionToOpen", "resolve"]


@dataclass(frozen=True)
class SessionToOpen:
    """The session the gateway would have created (its id and namespace are the turn's) and the
    deployment's layers of the turn's settings."""

    title: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    created_at: float = 0.0  # 0: when memory creates it
    deployment_tools: ToolPolicy = field(default_factory=ToolPolicy)
    deployment_permission_mode: str = ""


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


def resolve(request: "TurnRequest", opened: OpenedSession, known_models: Container[str]) -> "TurnRequest":
    """`request` with the session's settings applied; it opens nothing more (sub-agents inherit it)."""
    opening = request.opening
    assert opening is not None, "only a turn that opens its session is resolved"
    # Layers go before the turn's own (already in tool_policies): every one must allow a tool.
    layers = session_layers(opening.deployment_tools, opened.namespace_tools, opened.tools)
    return dataclasses.replace(
        request,
        namespace=opened.namespace or request.namespace,
        model=request.model or (opened.model if opened.model in known_models else ""),
        permission_mode=permission_mode_of(request.permission_mode, opened.permission_mode,
                                           opening.deployment_permission_mode),
        tool_policies=(*layers, *request.tool_policies),
        mcp_servers_version=opened.mcp_servers_version,
        opening=None,
    )
