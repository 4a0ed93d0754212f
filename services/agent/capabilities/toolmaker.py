"""From a Python function's source to a tool: check it and derive the JSON schema of its
arguments from its signature — by reading the syntax tree only. The code is never imported or
run here (it runs in the sandbox, promoted_tools.py); what cannot be described is refused with a
sentence the model can act on.

    made = describe(source, "word_count")   # MadeTool(description, parameters) or ToolRefused

Accepted parameter types: str, int, float, bool, list[T], dict[str, T], Optional[T] / T | None,
Literal["a", "b"] (strings or numbers), with literal defaults (which make a parameter optional).
Every parameter and the return value need a type hint; the function needs a docstring.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

SCALARS = {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}


class ToolRefused(ValueError):
    """Why a function cannot become a tool; the message is for the model."""


@dataclass(frozen=True)
class MadeTool:
    description: str
    parameters: dict[str, Any]


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):  # typing.Optional, t.List
        return node.attr
    return ""


def schema_of(node: ast.expr, where: str) -> dict[str, Any]:
    """The JSON schema of one annotation; ToolRefused for what JSON cannot carry."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a string annotation
        try:
            return schema_of(ast.parse(node.value, mode="eval").body, where)
        except SyntaxError:
            raise ToolRefused(f"{where}: the annotation {node.value!r} is not a type") from None
    if isinstance(node, ast.Constant) and node.value is None:
        return {"type": "null"}
    name = _name(node)
    if name in SCALARS:
        return {"type": SCALARS[name]}
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):  # T | None
        return {"anyOf": [schema_of(node.left, where), schema_of(node.right, where)]}
    if isinstance(node, ast.Subscript):
        outer = _name(node.value)
        inner = node.slice
        args = list(inner.elts) if isinstance(inner, ast.Tuple) else [inner]
        if outer in ("list", "List", "Sequence") and len(args) == 1:
            return {"type": "array", "items": schema_of(args[0], where)}
        if outer in ("dict", "Dict", "Mapping") and len(args) == 2:
            if _name(args[0]) != "str":
                raise ToolRefused(f"{where}: dictionary keys must be str (JSON object keys are strings)")
            return {"type": "object", "additionalProperties": schema_of(args[1], where)}
        if outer == "Optional" and len(args) == 1:
            return {"anyOf": [schema_of(args[0], where), {"type": "null"}]}
        if outer == "Union":
            return {"anyOf": [schema_of(a, where) for a in args]}
        if outer == "Literal":
            values = [a.value for a in args if isinstance(a, ast.Constant)]
            if len(values) != len(args) or not all(isinstance(v, (str, int, float)) for v in values):
                raise ToolRefused(f"{where}: Literal[...] may hold only strings and numbers")
            return {"enum": values}
    shown = ast.unparse(node)
    raise ToolRefused(f"{where}: the type {shown!r} cannot be described as JSON; use str, int, float, bool, "
                      "list[T], dict[str, T], Optional[T] or Literal[...]")


def describe(source: str, function: str) -> MadeTool:
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise ToolRefused(f"the file is not valid Python: {exc.msg} (line {exc.lineno})") from None
    found = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == function]
    if not found:
        defined = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
        raise ToolRefused(f"there is no top-level function {function!r} in the file; it defines: "
                          f"{', '.join(defined) or 'no functions'}")
    fn = found[0]
    if isinstance(fn, ast.AsyncFunctionDef):
        raise ToolRefused(f"{function} is async; promote a plain (synchronous) function")
    docstring = ast.get_docstring(fn)
    if not docstring or not docstring.strip():
        raise ToolRefused(f"{function} has no docstring: write one saying what the tool does (the model reads it)")
    a = fn.args
    if a.vararg or a.kwarg or a.posonlyargs:
        raise ToolRefused(f"{function} takes *args, **kwargs or positional-only parameters; "
                          "a tool takes named parameters only")
    params = a.args + a.kwonlyargs
    defaults = dict(zip([p.arg for p in a.args][len(a.args) - len(a.defaults):], a.defaults, strict=True))
    defaults.update({p.arg: d for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None})
    missing = [p.arg for p in params if p.annotation is None]
    if missing or fn.returns is None:
        what = ", ".join(repr(m) for m in missing) + (" and the return value" if fn.returns is None and missing else "")
        raise ToolRefused(f"{function} lacks type hints ({what or 'the return value'}): every parameter and the return "
                          "value need one, so the tool's arguments can be described and checked")
    properties: dict[str, Any] = {}
    required: list[str] = []
    for p in params:
        assert p.annotation is not None  # checked above: every parameter has a hint
        prop = schema_of(p.annotation, f"parameter {p.arg!r}")
        if p.arg in defaults:
            try:
                prop["default"] = ast.literal_eval(defaults[p.arg])
            except ValueError:
                raise ToolRefused(f"parameter {p.arg!r}: its default must be a literal (a number, string, "
                                  "list, ...)") from None
        else:
            required.append(p.arg)
        properties[p.arg] = prop
    parameters = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    return MadeTool(description=docstring.strip(), parameters=parameters)
