"""`Gateway.GetUsage`: token usage over a range, grouped, with cost estimates.

Plain Python over the memory service's usage ledger (a `UsageLedger` port: sums per group and
model). The range is resolved here, in UTC — "today" from 00:00, "7d" and "30d" that many
calendar days up to now, today included — and costs are estimated from each model's prices in
the deployment's catalogue (agentmesh.models): the ledger answers per (group, model) so that a
group's calls to a priced and an unpriced model are told apart (`cost_complete`).
"""

from __future__ import annotations

import datetime as dt
import math
import time
from typing import Callable, Protocol, Sequence

from agentmesh.errors import InvalidArgument
from agentmesh.internal.v1 import memory_service_pb2
from agentmesh.models import ModelCatalog
from agentmesh.v1 import gateway_pb2

__all__ = ["GROUPS", "RANGES", "UsageLedger", "UsageReports", "resolve_range"]

RANGES = ("today", "7d", "30d", "all")
GROUPS = ("day", "model", "session", "namespace")
DAY_S = 86_400


class UsageLedger(Protocol):
    async def sum_usage(self, start: float, end: float, group_by: str) -> Sequence[memory_service_pb2.UsageSum]:
        """Sums of the records in [start, end) per (group, model)."""
        ...


# 9999-12-31 23:59:59 UTC, the last second a date can name.
MAX_UNIX_TIME = 253_402_300_799.0


def _midnight_utc(now: float, days_back: int = 0) -> float:
    day = dt.datetime.fromtimestamp(now, dt.UTC).date() - dt.timedelta(days=days_back)
    return dt.datetime.combine(day, dt.time(), dt.UTC).timestamp()


def _when(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def resolve_range(name: str, start: float, end: float, now: float) -> tuple[float, float]:
    """[start, end) in unix seconds for a named range, or for explicit times (end 0: now).
    Anything that makes no sense is InvalidArgument with a sentence saying why."""
    for what, value in (("start", start), ("end", end)):
        # Past year 9999 no date exists to print or compare (datetime overflows), so it is refused.
        if not math.isfinite(value) or value < 0 or value > MAX_UNIX_TIME:
            raise InvalidArgument(
                f"{what} must be a unix time in seconds, from 0 to {MAX_UNIX_TIME:.0f} (9999-12-31), got {value:g}")
    if name and (start or end):
        raise InvalidArgument(f"give either range ({name!r}) or start/end, not both")
    if name:
        if name not in RANGES:
            raise InvalidArgument(f"range must be one of {', '.join(RANGES)} (or give start and end), got {name[:40]!r}")
        days = {"today": 0, "7d": 6, "30d": 29}.get(name)
        return (0.0 if days is None else _midnight_utc(now, days)), now
    if not start and not end:
        return _midnight_utc(now, 6), now
    end = end or now
    if end <= start:
        raise InvalidArgument(f"end ({_when(end)}) must be after start ({_when(start)})")
    if start > now:
        raise InvalidArgument(f"start ({_when(start)}) is in the future; there is no usage there yet")
    return start, end


class UsageReports:
    def __init__(self, ledger: UsageLedger, models: ModelCatalog, clock: Callable[[], float] = time.time):
        self._ledger = ledger
        self._models = models
        self._clock = clock

    def _price(self, model_name: str) -> tuple[float, float] | None:
        spec = self._models.get(model_name) if model_name else None
        if spec is None or (not spec.input_price_per_mtok and not spec.output_price_per_mtok):
            return None
        return spec.input_price_per_mtok, spec.output_price_per_mtok

    async def report(self, request: gateway_pb2.GetUsageRequest,
                     visible: Callable[[str], bool] = lambda namespace: True) -> gateway_pb2.GetUsageResponse:
        """`visible`: the namespaces the caller may see; other tenants' calls are left out."""
        group_by = request.group_by or "day"
        if group_by not in GROUPS:
            raise InvalidArgument(f"group_by must be one of {', '.join(GROUPS)}, got {group_by[:40]!r}")
        start, end = resolve_range(request.range, request.start, request.end, self._clock())
        sums = await self._ledger.sum_usage(start, end, group_by)
        groups: dict[str, gateway_pb2.UsageGroup] = {}
        total = gateway_pb2.UsageGroup(key="total", cost_complete=True)
        for row in sums:
            if not visible(row.namespace or "default"):
                continue
            group = groups.get(row.key)
            if group is None:
                group = groups[row.key] = gateway_pb2.UsageGroup(key=row.key, cost_complete=True)
            price = self._price(row.model_name)
            for target in (group, total):
                target.calls += row.calls
                target.input_tokens += row.input_tokens
                target.output_tokens += row.output_tokens
                target.cached_input_tokens += row.cached_input_tokens
                target.total_tokens += row.input_tokens + row.output_tokens
                target.fallback_calls += row.fallback_calls
                if price is None:
                    target.cost_complete = False
                else:
                    target.cost += (row.input_tokens * price[0] + row.output_tokens * price[1]) / 1_000_000
        return gateway_pb2.GetUsageResponse(start=start, end=end, group_by=group_by,
                                            groups=[groups[k] for k in sorted(groups)], total=total)
