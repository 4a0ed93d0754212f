"""What a tool is and what a call of it produced, in plain Python, for every service.

The tools service builds `ToolOutcome`s in its tools; the agent receives them (over
`agentmesh.rpc.convert`) and makes its own for the tools it runs itself (memory, sub-agents)
and for calls that never ran (denied, cancelled, unknown). One class, so the two ends cannot
drift apart.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentmesh.images import ImageRef

__all__ = ["ToolOutcome", "ToolSpec"]


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the model sees it: its name, what it does, and its arguments' JSON schema."""

    name: str
    description: str
    parameters: dict[str, Any]
    # Whether the tool runs code in a sandbox (command tools), as the catalog reports it.
    runs_code: bool = False
    # Whether the tool changes nothing (reads, searches, fetches): the "normal" permission mode
    # never holds its calls (agentmesh.toolpolicy).
    read_only: bool = False

    @property
    def schema_json(self) -> str:
        return json.dumps(self.parameters, separators=(",", ":"), sort_keys=True)


class _Call(Protocol):
    @property
    def call_id(self) -> str: ...
    @property
    def name(self) -> str: ...


@dataclass
class ToolOutcome:
    """The structured result of one call. `output` is the text the model reads."""

    output: str
    is_error: bool = False
    # A short machine-readable reason when `is_error`: "not_found", "timeout", "denied", ...
    error_kind: str = ""
    exit_code: int = 0
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False
    duration_ms: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)
    # Which call this answers; set by whoever knows the call (the agent, the tools adapter).
    call_id: str = ""
    name: str = ""
    # Images the call produced, stored once in the session's workspace (agentmesh.images): the
    # next model request shows them to the model.
    images: tuple[ImageRef, ...] = ()

    @classmethod
    def error(cls, call: _Call, kind: str, output: str) -> ToolOutcome:
        """A failed call of `call` (anything with `call_id` and `name`) the model should read."""
        return cls(output=output, is_error=True, error_kind=kind, call_id=call.call_id, name=call.name)
