"""Identifiers that cross service boundaries, and the one rule for what a valid one looks like."""

from __future__ import annotations

import re
import uuid

from agentmesh.errors import InvalidArgument

__all__ = ["DEFAULT_NAMESPACE", "PARENT_SESSION_LABEL", "new_id", "validate_id", "validate_namespace"]

_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
# Namespaces also name tenants and users ("team:infra", "ada@example"), so ':' and '@' are allowed.
_NAMESPACE = re.compile(r"^[A-Za-z0-9._:@-]{1,128}$")
DEFAULT_NAMESPACE = "default"


def validate_id(value: str, what: str = "session_id") -> str:
    """Return `value` if it is a safe id (also safe as a directory name), else raise InvalidArgument."""
    if not value:
        raise InvalidArgument(f"{what} is required", field=what)
    if not _ID.match(value) or value in (".", ".."):
        shown = value if len(value) <= 40 else value[:40] + "…"
        raise InvalidArgument(
            f"{what} {shown!r} is malformed: use 1-128 characters from A-Z, a-z, 0-9, '.', '_' and '-'", field=what
        )
    return value


def validate_namespace(namespace: str) -> str:
    """The memory namespace to use: `namespace`, or "default" when empty; InvalidArgument if malformed."""
    namespace = namespace or DEFAULT_NAMESPACE
    if not _NAMESPACE.match(namespace):
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
