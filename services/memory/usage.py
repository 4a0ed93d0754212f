"""The usage ledger: one record per model call, kept in the memory store beside the sessions.

Why here: the memory service is where agentmesh's durable state lives (Qdrant Edge on a laptop,
a Qdrant server or cluster in a cluster), and every agent and gateway replica already talks to
it. A record written by any agent replica is seen by every gateway replica, survives restarts of
all of them, and needs no second database. Records are apart from transcripts on purpose: a
rolled-back turn or a deleted session does not give back the tokens it spent.

Records are upserted by their `id` (the run id and the call's place in the run), so an agent
that retries a write after a timeout cannot count a call twice. Sums are computed here, by
scrolling the records of the range: the caller gets one row per (group, model) — enough to price
each model's share — never the records themselves.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, replace
from typing import Any, Sequence

from agentmesh.errors import InvalidArgument
from agentmesh.ids import validate_id, validate_namespace
from agentmesh.memory.ports import UsageStore, stored_time

GROUPS = ("day", "model", "session", "namespace")
MAX_RECORDS_PER_CALL = 1000
MAX_TOKENS = 10**12  # far above any real call: a guard against garbage, not a policy
PAGE = 1000
MAX_TEXT = 200


@dataclass(frozen=True)
class UsageRecord:
    id: str
    at: float
    session_id: str
    run_id: str
    namespace: str
    model_name: str
    model: str
    provider: str
    input_tokens: int
    output_tokens: int
    cached_input_tokens: int = 0
    fallback: bool = False
    purpose: str = "turn"
    root_session_id: str = ""

    def payload(self) -> dict[str, Any]:
        return dict(vars(self))  # every field a scalar: no need for asdict's deep copy


@dataclass
class UsageSum:
    key: str
    model_name: str
    namespace: str
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    fallback_calls: int = 0


def _checked(record: UsageRecord) -> UsageRecord:
    if not record.id or len(record.id) > 2 * MAX_TEXT:
        raise InvalidArgument("a usage record needs an id of at most 400 characters")
    validate_id(record.session_id, "session_id")
    if record.run_id:
        validate_id(record.run_id, "run_id")
    if record.root_session_id:
        validate_id(record.root_session_id, "root_session_id")
    validate_namespace(record.namespace or "default")
    for name in ("model_name", "model", "provider", "purpose"):
        if len(getattr(record, name)) > MAX_TEXT:
            raise InvalidArgument(f"usage record {name} is longer than {MAX_TEXT} characters")
    for name in ("input_tokens", "output_tokens", "cached_input_tokens"):
        if not 0 <= getattr(record, name) <= MAX_TOKENS:
            raise InvalidArgument(f"usage record {name} must be between 0 and {MAX_TOKENS}")
    if not math.isfinite(record.at) or record.at <= 0:
        raise InvalidArgument("usage record `at` must be a unix time")
    return replace(record, at=stored_time(record.at), namespace=record.namespace or "default",
                   root_session_id=record.root_session_id or record.session_id)


def _key(payload: dict[str, Any], group_by: str) -> str:
    if group_by == "day":
        return dt.datetime.fromtimestamp(float(payload.get("at", 0)), dt.UTC).strftime("%Y-%m-%d")
    if group_by == "model":
        return str(payload.get("model_name") or "")
    if group_by == "session":
        return str(payload.get("session_id") or "")
    return str(payload.get("namespace") or "default")


class UsageLedger:
    def __init__(self, store: UsageStore):
        self._store = store

    async def record(self, records: Sequence[UsageRecord]) -> int:
        if len(records) > MAX_RECORDS_PER_CALL:
            raise InvalidArgument(f"at most {MAX_RECORDS_PER_CALL} usage records per call, got {len(records)}")
        checked = [_checked(r) for r in records]
        await self._store.put_usage([r.payload() for r in checked])
        return len(checked)

    async def sums(self, start: float, end: float, group_by: str) -> tuple[list[UsageSum], int]:
        """One row per (group, model, namespace) of the records in [start, end), by key then model; and
        how many records there were."""
        if group_by not in GROUPS:
            raise InvalidArgument(f"group_by must be one of {', '.join(GROUPS)}, got {group_by[:40]!r}")
        if start < 0 or end < 0 or (end and end <= start):
            raise InvalidArgument("the usage range must have 0 <= start < end (end 0: now)")
        rows: dict[tuple[str, str, str], UsageSum] = {}
        seen = 0
        offset: str | None = None
        while True:
            page, next_offset = await self._store.scroll_usage(start, end, PAGE, offset)
            for payload in page:
                seen += 1
                key = (_key(payload, group_by), str(payload.get("model_name") or ""),
                       str(payload.get("namespace") or "default"))
                row = rows.get(key) or rows.setdefault(key, UsageSum(*key))
                row.calls += 1
                row.input_tokens += int(payload.get("input_tokens") or 0)
                row.output_tokens += int(payload.get("output_tokens") or 0)
                row.cached_input_tokens += int(payload.get("cached_input_tokens") or 0)
                row.fallback_calls += 1 if payload.get("fallback") else 0
            if not next_offset:
                break
            offset = next_offset
        return [rows[k] for k in sorted(rows)], seen
