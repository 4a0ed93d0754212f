"""Which tools a turn offers and which calls it refuses outright (docs/approvals.md#tool-policy):
the tool policies the gateway resolved (toolpolicy.py), applied to the whole catalog — the tools
service's, MCP's and the agent's own tools alike."""

from __future__ import annotations

from typing import Collection, Mapping

from agentmesh.agent.types import ToolCall, ToolOutcome, ToolSpec
from agentmesh.toolpolicy import ToolPolicy, allowed_by_all

__all__ = ["offered", "refusal"]


def offered(policies: Collection[ToolPolicy], name: str) -> bool:
    return allowed_by_all(policies, name)


def refusal(call: ToolCall, policies: Collection[ToolPolicy], catalog: Mapping[str, ToolSpec], *,
            catalog_known: bool, owned: Collection[str]) -> ToolOutcome | None:
    """The result of a call that must not run (its tool is off, or there is no such tool), given
    before anyone is asked to approve it; None for a call that may go on. `catalog`: what the
    turn offers; `owned`: the tools the agent runs itself."""
    if policies and not offered(policies, call.name):
        return ToolOutcome.error(call, "not_allowed", f"error: {call.name} was not run: the tool policy of this "
                                 f"deployment, namespace, session or turn turns it off; tools you may use: "
                                 f"{_names(catalog)}")
    if catalog_known and call.name not in catalog and call.name not in owned:
        return ToolOutcome.error(call, "not_found", f"error: there is no tool named {call.name!r}; available: {_names(catalog)}")
    return None


def _names(catalog: Mapping[str, ToolSpec]) -> str:
    return ", ".join(sorted(catalog)) or "none"
