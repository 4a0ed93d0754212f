"""Which tools a turn offers and which calls it refuses outright (docs/approvals.md#tool-policy):
the tool policies the gateway resolved (toolpolicy.py), applied to the whole catalog — the tools
service's, MCP's and the agent's own tools alike."""

from __future__ import annotations

from typing import Collection, Mapping

from agentmesh.agent.loop.session_open import NamedAgent
from agentmesh.agent.types import ToolCall, ToolOutcome, ToolSpec
from agentmesh.toolpolicy import ToolPolicy, allowed_by_all

__all__ = ["MCP_SEPARATOR", "mcp_servers_of", "offered", "refusal"]

# An MCP server's tools are listed as `<server>__<tool>` (docs/tools.md, the tools service's naming).
MCP_SEPARATOR = "__"


def mcp_servers_of(agent: NamedAgent | None) -> frozenset[str] | None:
    """The MCP servers a named agent's turns may use (its `mcpServers`); None: every one."""
    return frozenset(agent.mcp_servers) if agent is not None and agent.mcp_servers else None


def offered(policies: Collection[ToolPolicy], name: str, mcp_servers: Collection[str] | None = None) -> bool:
    """`mcp_servers`: the MCP servers whose tools may be offered (a named agent's), None: every one."""
    if mcp_servers is not None and MCP_SEPARATOR in name and name.split(MCP_SEPARATOR, 1)[0] not in mcp_servers:
        return False
    return allowed_by_all(policies, name)


def refusal(call: ToolCall, policies: Collection[ToolPolicy], catalog: Mapping[str, ToolSpec], *,
            catalog_known: bool, owned: Collection[str],
            mcp_servers: Collection[str] | None = None) -> ToolOutcome | None:
    """The result of a call that must not run (its tool is off, or there is no such tool), given
    before anyone is asked to approve it; None for a call that may go on. `catalog`: what the
    turn offers; `owned`: the tools the agent runs itself."""
    if mcp_servers is not None and not offered((), call.name, mcp_servers):
        return ToolOutcome.error(call, "not_allowed", f"error: {call.name} was not run: this agent uses the MCP "
                                 f"servers {', '.join(sorted(mcp_servers))} only; tools you may use: {_names(catalog)}")
    if policies and not offered(policies, call.name):
        return ToolOutcome.error(call, "not_allowed", f"error: {call.name} was not run: the tool policy of this "
                                 f"deployment, namespace, session or turn turns it off; tools you may use: "
                                 f"{_names(catalog)}")
    if catalog_known and call.name not in catalog and call.name not in owned:
        return ToolOutcome.error(call, "not_found", f"error: there is no tool named {call.name!r}; available: {_names(catalog)}")
    return None


def _names(catalog: Mapping[str, ToolSpec]) -> str:
    return ", ".join(sorted(catalog)) or "none"
