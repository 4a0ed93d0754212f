"""What a tool call produces, in plain Python: the core's answer before the adapter makes it a ToolResult."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ToolOutcome:
    """The structured result of one call. `output` is the text the model reads."""

    output: str
    is_error: bool = False
    error_kind: str = ""
    exit_code: int = 0
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False
    duration_ms: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)


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
