"""The tool catalog: each tool's name, description, JSON schema, and the argument check before a run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Protocol

from agentmesh.toolargs import ArgumentsSchema
from agentmesh.tooling import ToolSpec
from agentmesh.tools.results import ToolFailure, ToolOutcome

__all__ = [
    "CallContext",
    "ChangingProvider",
    "Tool",
    "ToolFunc",
    "ToolProvider",
    "ToolSpec",
    "boolean",
    "integer",
    "number",
    "obj",
    "string",
]


@dataclass(frozen=True)
class CallContext:
    """What a tool knows about the call it serves."""

    session_id: str
    call_id: str
    # The caller's upper bound in seconds (ExecuteRequest.timeout_s); 0 means none.
    caller_timeout_s: float = 0.0
    # The sandbox template command tools run in ("": default; sandbox/templates.py), checked by the core.
    sandbox_template: str = ""
    isolation: str = ""  # "call" | "session" over the template's; "": the template's
    namespace: str = ""  # the session's namespace (ExecuteRequest.namespace)
    tenant: str = ""  # the session's tenant ("" without tenancy)


ToolFunc = Callable[[CallContext, dict[str, Any]], Awaitable[ToolOutcome]]


@dataclass(frozen=True)
class Tool:
    spec: ToolSpec
    run: ToolFunc
    schema: ArgumentsSchema = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "schema", ArgumentsSchema(self.spec.name, self.spec.parameters))

    def parse_arguments(self, arguments_json: str) -> dict[str, Any]:
        """Decode and validate model-made arguments; a ToolFailure says what to fix."""
        try:
            return self.schema.parse(arguments_json)
        except ValueError as exc:
            raise ToolFailure("invalid_arguments", str(exc)) from None


class ToolProvider(Protocol):
    def tools(self) -> list[Tool]: ...


class ChangingProvider(Protocol):
    """A provider whose tools change while the service runs (`dynamic = True`: MCP servers,
    remote A2A agents): asked on each look, and it calls `on_change` when they change."""

    dynamic: bool
    on_change: Callable[[], None]

    def tools(self) -> list[Tool]: ...
    def find(self, name: str) -> Tool | None: ...


def obj(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """An arguments schema: a closed object, so misspelled argument names are reported, not ignored."""
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def string(description: str, max_length: int = 4096, min_length: int = 0) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string", "description": description, "maxLength": max_length}
    if min_length:
        schema["minLength"] = min_length
    return schema


def integer(description: str, minimum: int, maximum: int) -> dict[str, Any]:
    return {"type": "integer", "description": description, "minimum": minimum, "maximum": maximum}


def number(description: str, minimum: float, maximum: float) -> dict[str, Any]:
    return {"type": "number", "description": description, "exclusiveMinimum": minimum, "maximum": maximum}


def boolean(description: str) -> dict[str, Any]:
    return {"type": "boolean", "description": description}
