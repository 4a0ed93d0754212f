"""The tool catalog: each tool's name, description, JSON schema, and the argument check before a run."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Protocol

from jsonschema import Draft202012Validator

from agentmesh.tools.results import ToolFailure, ToolOutcome


@dataclass(frozen=True)
class CallContext:
    """What a tool knows about the call it serves."""

    session_id: str
    call_id: str
    # The caller's upper bound in seconds (ExecuteRequest.timeout_s); 0 means none.
    caller_timeout_s: float = 0.0


ToolFunc = Callable[[CallContext, dict[str, Any]], Awaitable[ToolOutcome]]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]
    runs_code: bool = False

    @property
    def schema_json(self) -> str:
        return json.dumps(self.parameters, separators=(",", ":"), sort_keys=True)


@dataclass(frozen=True)
class Tool:
    spec: ToolSpec
    run: ToolFunc
    validator: Draft202012Validator = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        Draft202012Validator.check_schema(self.spec.parameters)
        object.__setattr__(self, "validator", Draft202012Validator(self.spec.parameters))

    def parse_arguments(self, arguments_json: str) -> dict[str, Any]:
        """Decode and validate model-made arguments; a ToolFailure says what to fix."""
        text = arguments_json.strip() or "{}"
        try:
            arguments = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ToolFailure(
                "invalid_arguments", f"arguments for {self.spec.name} are not valid JSON ({exc.msg} at position {exc.pos})"
            ) from None
        errors = sorted(self.validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
        if errors:
            problems = "; ".join(_describe(error) for error in errors[:5])
            raise ToolFailure(
                "invalid_arguments",
                f"invalid arguments for {self.spec.name}: {problems}. Expected schema: {self.spec.schema_json}",
            )
        return arguments


def _describe(error) -> str:
    where = "/".join(str(p) for p in error.absolute_path)
    return f"{where}: {error.message}" if where else error.message


class ToolProvider(Protocol):
    def tools(self) -> list[Tool]: ...


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
