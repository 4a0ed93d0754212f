"""How a tool reports a failure the model should read; `ToolOutcome` (shared with the agent) is what a call produced."""

from __future__ import annotations

from typing import Any

from agentmesh.tooling import ToolOutcome

__all__ = ["ToolFailure", "ToolOutcome"]


class ToolFailure(Exception):
    """Raised inside a tool for a failure the model should read and correct (bad path, no match, ...).

    `kind` becomes ToolResult.error_kind: a short machine-readable reason such as
    "path_escape", "not_found", "invalid_arguments".
    """

    def __init__(self, kind: str, message: str, data: dict[str, Any] | None = None):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.data = data or {}

    def outcome(self) -> ToolOutcome:
        return ToolOutcome(output=self.message, is_error=True, error_kind=self.kind, data=dict(self.data))
