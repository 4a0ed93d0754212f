"""Checking model-written tool arguments against the tool's JSON schema, with an answer the
model can act on. Shared by the tools service (its catalog) and the agent (the tools it runs
itself: memory_save, memory_search, delegate_task), so every tool refuses bad arguments alike."""

from __future__ import annotations

import json
from typing import Any

from jsonschema import Draft202012Validator, ValidationError

__all__ = ["MAX_DEPTH", "ArgumentsSchema", "decode_arguments"]

_MAX_PROBLEMS = 5
# Arguments nest a few levels in practice. A bound far above that, and far below Python's
# recursion limit, so what reads the value afterwards (the schema check, json.dumps, an MCP
# server's SDK) never recurses into a RecursionError.
MAX_DEPTH = 64


def _no_constant(name: str) -> Any:
    # json.loads takes NaN and Infinity, which JSON does not have: `timeout_s: NaN` would pass
    # every minimum/maximum of a schema (comparisons with NaN are false).
    raise ValueError(f"{name} is not a JSON number (JSON has no NaN or Infinity)")


def decode_arguments(arguments_json: str, what: str = "arguments") -> Any:
    """The decoded JSON value of a tool call's arguments; ValueError with a sentence the model can
    act on when the text is not JSON, nests deeper than MAX_DEPTH, holds NaN/Infinity, or holds a
    string no program or file name can take (a lone UTF-16 surrogate, e.g. "\\ud800")."""
    text = arguments_json.strip() or "{}"
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} are not valid JSON ({exc.msg} at position {exc.pos})") from None
    except RecursionError:
        raise ValueError(f"{what} nest too deeply (at most {MAX_DEPTH} levels of arrays and objects)") from None
    except ValueError as exc:
        raise ValueError(f"{what} are not valid JSON: {exc}") from None
    _check_value(value, what)
    return value


def _check_value(value: Any, what: str) -> None:
    """Depth and strings, without recursion (the value may be anything json.loads returned)."""
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, str):
            _check_string(item, what)
            continue
        if not isinstance(item, (dict, list)):
            continue
        if depth > MAX_DEPTH:
            raise ValueError(f"{what} nest too deeply (at most {MAX_DEPTH} levels of arrays and objects)")
        if isinstance(item, dict):
            for key, inner in item.items():
                _check_string(key, what)
                pending.append((inner, depth + 1))
        else:
            pending.extend((inner, depth + 1) for inner in item)


def _check_string(text: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{what} hold a lone UTF-16 surrogate (\\u{ord(text[exc.start]):04x}), which is not a character "
            "and cannot be part of a path, a command or a file; write the character itself"
        ) from None


# The schemas (as JSON text) already checked against the metaschema in this process. Checking one
# walks the whole 2020-12 metaschema (~10 ms of CPU), and the same schemas come again and again:
# every start of the tools service defines the built-in tools anew, the gateway checks a held call's
# edited arguments against its tool's schema. Bounded: MCP servers may bring any number of schemas.
_VALID_SCHEMAS: dict[str, None] = {}
_MAX_REMEMBERED = 4096


def _remember_valid(schema_json: str) -> None:
    if not schema_json:
        return
    if len(_VALID_SCHEMAS) >= _MAX_REMEMBERED:
        _VALID_SCHEMAS.pop(next(iter(_VALID_SCHEMAS)))
    _VALID_SCHEMAS[schema_json] = None


class ArgumentsSchema:
    """One tool's argument schema, checked once when the tool is defined."""

    def __init__(self, tool_name: str, schema: dict[str, Any]):
        try:
            schema_json = json.dumps(schema, separators=(",", ":"), sort_keys=True)
        except (TypeError, ValueError):
            schema_json = ""  # not JSON: the check below says what is wrong with it
        if not schema_json or schema_json not in _VALID_SCHEMAS:
            Draft202012Validator.check_schema(schema)
            _remember_valid(schema_json)
        self.tool_name = tool_name
        self.schema_json = schema_json or json.dumps(schema, separators=(",", ":"), sort_keys=True)
        self._validator = Draft202012Validator(schema)

    def parse(self, arguments_json: str) -> dict[str, Any]:
        """The decoded arguments; ValueError saying what to fix when they are not valid JSON or
        do not match the schema (the schema itself is quoted, so the model can correct the call)."""
        arguments: dict[str, Any] = decode_arguments(arguments_json, f"arguments for {self.tool_name}")
        errors = sorted(self._validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
        if errors:
            problems = "; ".join(_describe(error) for error in errors[:_MAX_PROBLEMS])
            raise ValueError(f"invalid arguments for {self.tool_name}: {problems}. Expected schema: {self.schema_json}")
        return arguments


def _describe(error: ValidationError) -> str:
    where = "/".join(str(p) for p in error.absolute_path)
    return f"{where}: {error.message}" if where else error.message
