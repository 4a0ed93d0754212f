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


async def test_a_long_sentence_still_reaches_the_client_with_its_reason():
    # Trailers past gRPC's 8 KiB soft limit are refused by the client at random (a 3000-character
    # sentence with its details failed 6 calls in 20): the sentence is cut so every call arrives.
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    from agentmesh.errors import InvalidArgument
    from agentmesh.rpc.errors import MAX_MESSAGE_BYTES, translate_errors

    class Refuses:
        @translate_errors
        async def call(self, request, context):
            raise InvalidArgument("known tools: " + ", ".join(f"tool_{i}" for i in range(2000)), field="tools.allow",
                                  reason=error_reasons.UNKNOWN_TOOL)

    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(Refuses().call)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("t.Refuses", {"Call": handler})])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            for _ in range(20):
                try:
                    await channel.unary_unary("/t.Refuses/Call")(b"", timeout=10)
                except grpc.aio.AioRpcError as err:
                    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
                    assert err.details().startswith("known tools: tool_0, ") and err.details().endswith("…")
                    assert len(err.details().encode()) <= MAX_MESSAGE_BYTES
                    info = error_details_pb2.ErrorInfo()
                    assert rpc_status.from_call(err).details[0].Unpack(info) and info.reason == "UNKNOWN_TOOL"
                else:
                    raise AssertionError("the call was not refused")
    finally:
        await server.stop(0)
