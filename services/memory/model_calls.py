"""Model calls' payloads, as the agent records them when the deployment turns it on
(AGENTMESH_AGENT_RECORD_MODEL_CALLS; docs/api.md "Model calls"): the request and the response of
each call, read back by the dev panel through `Gateway.ListModelCalls`.

They are kept with the session's transcript messages (the store's `put_model_calls`), so deleting
the session — by hand, or retention's sweep of old sessions — takes them with it. The agent has
already masked keys and cut each side to its bound; this checks what it sends against a hard
ceiling, so no caller can fill the store with one record.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from agentmesh.errors import InvalidArgument
from agentmesh.ids import validate_id
from agentmesh.memory.ports import MessageStore, stored_time

__all__ = ["MAX_CALLS_PER_WRITE", "MAX_PAYLOAD_CHARS", "ModelCallRecord", "ModelCalls"]

MAX_CALLS_PER_WRITE = 100
# Above the agent's own bound (AGENTMESH_AGENT_MODEL_CALL_MAX_CHARS at most 1,000,000 a side).
MAX_PAYLOAD_CHARS = 1_100_000
MAX_TEXT = 200


@dataclass(frozen=True)
class ModelCallRecord:
    id: str
    session_id: str
    run_id: str
    at: float
    model: str
    provider: str
    request_json: str
    response_json: str
    truncated: bool = False
    purpose: str = "turn"

    def payload(self) -> dict[str, Any]:
        return dict(vars(self))

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> "ModelCallRecord":
        return cls(**{name: payload[name] for name in cls.__dataclass_fields__ if name in payload})


def _checked(record: ModelCallRecord) -> ModelCallRecord:
    if not record.id or len(record.id) > MAX_TEXT:
        raise InvalidArgument("a model call record needs an id of at most 200 characters")
    validate_id(record.session_id, "session_id")
    if record.run_id:
        validate_id(record.run_id, "run_id")
    for name in ("model", "provider", "purpose"):
        if len(getattr(record, name)) > MAX_TEXT:
            raise InvalidArgument(f"model call {name} is longer than {MAX_TEXT} characters")
    for name in ("request_json", "response_json"):
        if len(getattr(record, name)) > MAX_PAYLOAD_CHARS:
            raise InvalidArgument(f"model call {name} is longer than {MAX_PAYLOAD_CHARS} characters")
    if not math.isfinite(record.at) or record.at <= 0:
        raise InvalidArgument("model call `at` must be a unix time")
    return ModelCallRecord(**{**record.payload(), "at": stored_time(record.at)})


class ModelCalls:
    def __init__(self, store: MessageStore):
        self._store = store

    async def record(self, records: Sequence[ModelCallRecord]) -> int:
        if len(records) > MAX_CALLS_PER_WRITE:
            raise InvalidArgument(f"at most {MAX_CALLS_PER_WRITE} model calls per write, got {len(records)}")
        checked = [_checked(r) for r in records]
        await self._store.put_model_calls([r.payload() for r in checked])
        return len(checked)

    async def list(self, session_id: str, run_id: str = "") -> list[ModelCallRecord]:
        """The session's calls (of `run_id` only, when given), oldest first."""
        validate_id(session_id)
        if run_id:
            validate_id(run_id, "run_id")
        found = [ModelCallRecord.from_payload(p) for p in await self._store.list_model_calls(session_id)]
        return sorted((r for r in found if not run_id or r.run_id == run_id), key=lambda r: (r.at, r.id))
