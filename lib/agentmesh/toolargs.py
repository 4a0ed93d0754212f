"""Checking model-written tool arguments against the tool's JSON schema, with an answer the
model can act on. Shared by the tools service (its catalog) and the agent (the tools it runs
itself: memory_save, memory_search, delegate_task), so every tool refuses bad arguments alike."""

from __future__ import annotations

import json
from typing import Any

from jsonschema import Draft202012Validator, ValidationError

__all__ = ["ArgumentsSchema"]

_MAX_PROBLEMS = 5


class ArgumentsSchema:
    """One tool's argument schema, checked once when the tool is defined."""

    def __init__(self, tool_name: str, schema: dict[str, Any]):
        Draft202012Validator.check_schema(schema)
        self.tool_name = tool_name
        self.schema_json = json.dumps(schema, separators=(",", ":"), sort_keys=True)
        self._validator = Draft202012Validator(schema)

    def parse(self, arguments_json: str) -> dict[str, Any]:
        """The decoded arguments; ValueError saying what to fix when they are not valid JSON or
        do not match the schema (the schema itself is quoted, so the model can correct the call)."""
        text = arguments_json.strip() or "{}"
        try:
            # The schema's type=object check follows. NaN and Infinity are not JSON, and no
            # bound of a schema holds them back (every comparison with NaN is false).
            arguments: dict[str, Any] = json.loads(text, parse_constant=_not_a_number)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"arguments for {self.tool_name} are not valid JSON ({exc.msg} at position {exc.pos})"
            ) from None
        except RecursionError:
            raise ValueError(f"arguments for {self.tool_name} nest too deeply: send a flatter JSON object") from None
        except _NotANumber as exc:
            raise ValueError(f"arguments for {self.tool_name} are not valid JSON: {exc} (write a number)") from None
        errors = sorted(self._validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
        if errors:
            problems = "; ".join(_describe(error) for error in errors[:_MAX_PROBLEMS])
            raise ValueError(f"invalid arguments for {self.tool_name}: {problems}. Expected schema: {self.schema_json}")
        return arguments


class _NotANumber(ValueError):
    pass


def _not_a_number(literal: str) -> Any:
    raise _NotANumber(f"{literal} is not a JSON number")


def _describe(error: ValidationError) -> str:
    where = "/".join(str(p) for p in error.absolute_path)
    return f"{where}: {error.message}" if where else error.message
