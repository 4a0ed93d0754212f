"""Identifiers that cross service boundaries, and the one rule for what a valid one looks like."""

from __future__ import annotations

import re
import uuid

from agentmesh.errors import InvalidArgument

__all__ = ["DEFAULT_NAMESPACE", "ID_PATTERN", "NAMESPACE_PATTERN", "PARENT_SESSION_LABEL", "new_id", "validate_id",
           "validate_namespace"]

# Also what the OpenAPI document says (JSON Schema `pattern`). Matched whole (fullmatch): with
# re.match, `$` also matches before a final newline, so "s1\n" passed.
ID_PATTERN = r"^[A-Za-z0-9._-]{1,128}$"
# Namespaces also name tenants and users ("team:infra", "ada@example"), so ':' and '@' are allowed.
NAMESPACE_PATTERN = r"^[A-Za-z0-9._:@-]{1,128}$"
_ID = re.compile(ID_PATTERN[1:-1])
_NAMESPACE = re.compile(NAMESPACE_PATTERN[1:-1])
DEFAULT_NAMESPACE = "default"


def validate_id(value: str, what: str = "session_id") -> str:
    """Return `value` if it is a safe id (also safe as a directory name), else raise InvalidArgument."""
    if not value:
        raise InvalidArgument(f"{what} is required", field=what)
    if not _ID.fullmatch(value) or value in (".", ".."):
        shown = value if len(value) <= 40 else value[:40] + "…"
        raise InvalidArgument(
            f"{what} {shown!r} is malformed: use 1-128 characters from A-Z, a-z, 0-9, '.', '_' and '-'", field=what
        )
    return value


def validate_namespace(namespace: str) -> str:
    """The memory namespace to use: `namespace`, or "default" when empty; InvalidArgument if malformed."""
    namespace = namespace or DEFAULT_NAMESPACE
    if not _NAMESPACE.fullmatch(namespace):
        shown = namespace if len(namespace) <= 40 else namespace[:40] + "…"
        raise InvalidArgument(
            f"namespace {shown!r} is malformed: use 1-128 characters from A-Z, a-z, 0-9, '.', '_', '-', ':' and '@'",
            field="namespace",
        )
    return namespace


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


# A session labelled with this key is part of the session it names (a sub-agent's conversation):
# the memory service deletes it with that session.
PARENT_SESSION_LABEL = "parent_session"
