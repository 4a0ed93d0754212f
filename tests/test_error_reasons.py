"""One vocabulary of error reasons (agentmesh.error_reasons): every reason the code raises with
is in it, every one in it is documented in docs/api.md's table (and only those), and each goes
with a real gRPC status code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import grpc

from agentmesh import error_reasons, errors
from agentmesh.error_reasons import REASONS

# What takes a reason: the error classes and the helpers that build a status or an error body
# (an audit record's `reason=` is a sentence, not one of these).
TAKES_A_REASON = {name for name, value in vars(errors).items() if isinstance(value, type)} | {
    "error_of_code", "status_details", "abort_with", "error_response", "error_body", "NotSupported"}
ROOT = Path(__file__).resolve().parent.parent
SOURCES = [p for folder in ("lib", "services", "cli") for p in (ROOT / folder).rglob("*.py") if "/v1/" not in p.as_posix()]


def reasons_used() -> dict[str, list[str]]:
    """Reason -> where: every `error_reasons.NAME`, and every `reason="..."` given as a literal
    to what takes a reason."""
    used: dict[str, list[str]] = {}
    for path in SOURCES:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = []
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in ("error_reasons", "reasons") and node.attr.isupper()):
                names.append(node.attr)
            elif isinstance(node, ast.Call) and _called(node) in TAKES_A_REASON:
                names += [k.value.value for k in node.keywords if k.arg == "reason"
                          and isinstance(k.value, ast.Constant) and isinstance(k.value.value, str) and k.value.value]
            for name in names:
                used.setdefault(name, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return used


def _called(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def documented() -> dict[str, str]:
    """Reason -> code, from the table in docs/api.md's "Error reasons"."""
    text = (ROOT / "docs" / "api.md").read_text()
    section = text.split("## Error reasons", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"^\| `([A-Z_]+)` \| `([A-Z_]+)` \|", section, re.MULTILINE))


def test_every_reason_the_code_uses_is_in_the_vocabulary():
    used = reasons_used()
    assert used, "the scan found no reasons at all"
    unknown = {name: where for name, where in used.items() if name not in REASONS and name not in ("DOMAIN", "REASONS")}
    assert unknown == {}


def test_every_reason_is_documented_with_its_code_and_nothing_else_is():
    assert documented() == {r.name: r.code for r in REASONS.values()}


def test_each_reason_goes_with_a_real_status_and_each_code_has_a_generic_reason():
    codes = {code.name for code in grpc.StatusCode}
    assert all(r.code in codes and r.name == name for name, r in REASONS.items())
    for code in ("INVALID_ARGUMENT", "NOT_FOUND", "FAILED_PRECONDITION", "PERMISSION_DENIED", "UNAUTHENTICATED",
                 "RESOURCE_EXHAUSTED", "UNAVAILABLE", "INTERNAL"):
        assert REASONS[error_reasons.default_reason(code)].code == code
