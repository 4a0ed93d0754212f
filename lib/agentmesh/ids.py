"""Identifiers that cross service boundaries, and the one rule for what a valid one looks like."""

from __future__ import annotations

import re
import uuid

from agentmesh.errors import InvalidArgument

_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


def validate_id(value: str, what: str = "session_id") -> str:
    """Return `value` if it is a safe id (also safe as a directory name), else raise InvalidArgument."""
    if not value:
        raise InvalidArgument(f"{what} is required")
    if not _ID.match(value) or value in (".", ".."):
        shown = value if len(value) <= 40 else value[:40] + "…"
        raise InvalidArgument(
            f"{what} {shown!r} is malformed: use 1-128 characters from A-Z, a-z, 0-9, '.', '_' and '-'"
        )
    return value


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:16]}"
