"""What a long-term memory is, and what a valid one is: the records the core stores and returns,
and the checks every remembered item and filter passes before it reaches the store.

Kept apart from the core (memories.py, which stores, embeds and retrieves them) so that the wire
conversion (convert.py) and the turn's recall use the records without the core.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from agentmesh.errors import InvalidArgument
from agentmesh.memory.text import normalize_text

DEFAULT_KIND = "fact"
_KIND = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")
_METADATA_KEY = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_METADATA_KEYS = 64
MAX_METADATA_BYTES = 16 * 1024
_ID_NAMESPACE = uuid.UUID("0f6e1d2c-8b1a-4c3e-9f7d-2a6b5c4d3e21")


@dataclass
class RememberItem:
    namespace: str
    text: str
    kind: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    id: str = ""
    source_session_id: str = ""
    created_at: float = 0.0
    created_by: str = ""  # the principal's subject that made it (erasure finds it by that)
    vector: tuple[float, ...] = ()  # import: the dense vector as exported, used instead of embedding


@dataclass
class MemoryRecord:
    id: str
    namespace: str
    text: str
    kind: str
    metadata: dict[str, Any]
    created_at: float
    updated_at: float
    source_session_id: str = ""
    created_by: str = ""

    @classmethod
    def from_payload(cls, p: dict[str, Any]) -> "MemoryRecord":
        return cls(
            id=p["id"],
            namespace=p["namespace"],
            text=p["text"],
            kind=p.get("kind", DEFAULT_KIND),
            metadata=dict(p.get("metadata") or {}),
            created_at=float(p.get("created_at", 0.0)),
            updated_at=float(p.get("updated_at", 0.0)),
            source_session_id=p.get("source_session_id", ""),
            created_by=str(p.get("created_by") or ""),
        )


@dataclass(frozen=True)
class MemoryQuery:
    """Conditions as clients state them (before validation)."""

    kinds: tuple[str, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)
    created_after: float = 0.0
    created_before: float = 0.0
    source_session_id: str = ""

    def is_empty(self) -> bool:
        return not (self.kinds or self.metadata or self.created_after or self.created_before or self.source_session_id)


@dataclass
class Hit:
    memory: MemoryRecord
    score: float


def content_id(namespace: str, text: str) -> str:
    """The id a memory gets from its content: the same text (up to case and spacing) twice is one memory."""
    return str(uuid.uuid5(_ID_NAMESPACE, f"{namespace}\x1f{normalize_text(text)}"))


def plain_numbers(value: Any) -> Any:
    # Struct carries every number as a double; whole numbers are stored as integers so that
    # an exact-match filter on {"turn": 3} finds them (Qdrant matches integers, not floats).
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: plain_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_numbers(v) for v in value]
    return value


def check_kind(kind: str) -> str:
    if not _KIND.match(kind):
        raise InvalidArgument(
            f"kind {kind[:40]!r} is malformed: use a lower-case word of up to 64 characters (a-z, 0-9, '_', '-'), "
            "e.g. fact, knowledge, learning, episode, skill, preference"
        )
    return kind


def check_metadata(metadata: dict[str, Any], what: str = "metadata") -> dict[str, Any]:
    if len(metadata) > MAX_METADATA_KEYS:
        raise InvalidArgument(f"{what} has {len(metadata)} keys; the limit is {MAX_METADATA_KEYS}")
    for key in metadata:
        if not _METADATA_KEY.match(key):
            raise InvalidArgument(
                f"{what} key {key[:40]!r} is malformed: use 1-64 characters from A-Z, a-z, 0-9, '_' and '-'"
            )
    size = len(json.dumps(metadata))
    if size > MAX_METADATA_BYTES:
        raise InvalidArgument(f"{what} is {size} bytes as JSON; the limit is {MAX_METADATA_BYTES}")
    plain: dict[str, Any] = plain_numbers(metadata)
    return plain
