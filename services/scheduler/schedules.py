"""Schedule specs: parsing with clear refusals, and next/previous due times in a timezone.

Forms accepted:
  "*/5 * * * *"        standard 5-field cron (minute hour day-of-month month day-of-week);
                       day-of-month and day-of-week together match when EITHER matches (Vixie cron)
  "@hourly" "@daily" "@midnight" "@weekly" "@monthly" "@yearly" "@annually"   cron shorthands
  "every 30s|10m|2h|1d" a fixed interval, counted from the job's anchor (creation or last
                       schedule change) so restarts keep the phase
  "daily 09:00"        every day at that wall-clock time in the job's timezone
  "hourly :15"         every hour at that minute
  "startup" "@reboot"  once each time a scheduler becomes the active (leader) instance

Daylight-saving changes follow Vixie cron: a wall time skipped by a spring-forward jump runs
once at the first instant after the jump, and a wall time repeated by a fall-back runs only at
its first occurrence — unless the hour field is `*`, where both real hours are distinct runs.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, CroniterError, croniter

from agentmesh.errors import InvalidArgument

MAX_SPEC_CHARS = 200
MAX_INTERVAL_S = 366 * 86400

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_EVERY = re.compile(r"^every\s+(\d+)\s*([a-z]+)$")
_DAILY = re.compile(r"^daily\s+(\d{1,2}):(\d{2})$")
_HOURLY = re.compile(r"^hourly\s+:?(\d{1,2})$")
_TZ_NAME = re.compile(r"^[A-Za-z0-9_+\-]+(/[A-Za-z0-9_+\-]+)*$")
_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_FIELD_NAMES = ("minute", "hour", "day of month", "month", "day of week")
# Safety bound when skipping repeated fall-back wall times; two skips in a row never happen.
_MAX_SKIPS = 4


def load_timezone(name: str) -> ZoneInfo:
    """The IANA zone `name` ("UTC" when empty), or InvalidArgument saying why not."""
    name = name or "UTC"
    if len(name) > 64 or not _TZ_NAME.match(name):
        raise InvalidArgument(f"timezone {name[:64]!r} is not an IANA timezone name like 'Europe/Berlin' or 'UTC'")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidArgument(f"timezone {name!r} is unknown: use an IANA name like 'America/New_York' or 'UTC'") from None


@dataclass(frozen=True)
class CronSchedule:
    expr: str

    @property
    def _hour_is_wildcard(self) -> bool:
        return self.expr.split()[1] == "*"

    def _accept(self, ts: float, tz: ZoneInfo) -> bool:
        # zoneinfo marks the second pass through a repeated wall time with fold=1.
        return self._hour_is_wildcard or datetime.fromtimestamp(ts, tz).fold == 0

    def next_after(self, t: float, tz: ZoneInfo, anchor: float = 0.0) -> float | None:
        it = croniter(self.expr, datetime.fromtimestamp(t, tz))
        for _ in range(_MAX_SKIPS):
            ts: float = it.get_next(float)
            if ts > t and self._accept(ts, tz):
                return ts
        return None

    def latest_at_or_before(self, t: float, tz: ZoneInfo, anchor: float = 0.0) -> float | None:
        # croniter's get_prev is strictly before its start; start just past t so t itself counts.
        it = croniter(self.expr, datetime.fromtimestamp(math.floor(t) + 1, tz))
        for _ in range(_MAX_SKIPS):
            ts: float = it.get_prev(float)
            if ts <= t and self._accept(ts, tz):
                return ts
        return None


@dataclass(frozen=True)
class IntervalSchedule:
    seconds: int

    def next_after(self, t: float, tz: ZoneInfo, anchor: float = 0.0) -> float | None:
        k = max(1, math.floor((t - anchor) / self.seconds) + 1)
        due = anchor + k * self.seconds
        return due if due > t else due + self.seconds

    def latest_at_or_before(self, t: float, tz: ZoneInfo, anchor: float = 0.0) -> float | None:
        k = math.floor((t - anchor) / self.seconds)
        return anchor + k * self.seconds if k >= 1 else None


@dataclass(frozen=True)
class StartupSchedule:
    """Fires when a scheduler instance becomes the leader, never on the clock."""

    def next_after(self, t: float, tz: ZoneInfo, anchor: float = 0.0) -> float | None:
        return None

    def latest_at_or_before(self, t: float, tz: ZoneInfo, anchor: float = 0.0) -> float | None:
        return None


@dataclass(frozen=True)
class OnceSchedule:
    """A one-off job (`run_at`): due once at `at`, then never again."""

    at: float

    def next_after(self, t: float, tz: ZoneInfo, anchor: float = 0.0) -> float | None:
        return self.at if self.at > t else None

    def latest_at_or_before(self, t: float, tz: ZoneInfo, anchor: float = 0.0) -> float | None:
        return self.at if self.at <= t else None


Schedule = CronSchedule | IntervalSchedule | StartupSchedule | OnceSchedule

# How far ahead a one-off job may be set: as far as the longest interval, so a typo in the year
# ("2062") is refused rather than silently parked for decades.
MAX_ONE_OFF_S = MAX_INTERVAL_S
_DELAY = re.compile(r"^(\d+)\s*([a-z]+)$")


def parse_delay(text: str) -> int:
    """`30s`, `10m`, `2h`, `1d` as seconds (`--in`), or InvalidArgument saying how to write it."""
    match = _DELAY.match(" ".join((text or "").split()).lower())
    if not match or match.group(2) not in _UNITS:
        raise InvalidArgument(f"delay {text[:40]!r}: write it as a number and a unit s, m, h or d, e.g. '30s' or '2h'")
    seconds = int(match.group(1)) * _UNITS[match.group(2)]
    if seconds < 1:
        raise InvalidArgument(f"delay {text!r}: it must be at least 1 second")
    if seconds > MAX_ONE_OFF_S:
        raise InvalidArgument(f"delay {text!r}: a one-off job may be at most 366 days ahead")
    return seconds


def parse_time(text: str, timezone: str = "UTC") -> float:
    """An ISO 8601 time (`2026-12-01T09:00Z`, `2026-12-01 09:00+01:00`) as Unix seconds; one
    without an offset is a wall-clock time in `timezone`."""
    value = (text or "").strip()
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidArgument(
            f"time {value[:60]!r} is not an ISO 8601 time; write it like '2026-12-01T09:00Z' or "
            "'2026-12-01T09:00+01:00'"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=load_timezone(timezone))
    return moment.timestamp()


def check_run_at(run_at: float, now: float) -> None:
    """A one-off time being set must be ahead of `now` and within the horizon."""
    if not math.isfinite(run_at) or run_at <= 0:
        raise InvalidArgument("run_at must be a time (Unix seconds) in the future")
    when = datetime.fromtimestamp(run_at, ZoneInfo("UTC")).strftime("%Y-%m-%d %H:%M:%SZ")
    if run_at <= now:
        raise InvalidArgument(f"run_at {when} is in the past; a one-off job needs a time in the future")
    if run_at - now > MAX_ONE_OFF_S:
        raise InvalidArgument(f"run_at {when} is more than 366 days ahead; a one-off job may be at most 366 days away")


def parse_schedule(spec: str) -> Schedule:
    """Parse a schedule spec or raise InvalidArgument with a sentence about what is wrong."""
    text = " ".join((spec or "").split())
    if not text:
        raise InvalidArgument(
            "schedule is empty: use a cron expression like '*/5 * * * *', 'every 10m', 'daily 09:00', "
            "'hourly :15' or 'startup'"
        )
    if len(text) > MAX_SPEC_CHARS:
        raise InvalidArgument(f"schedule is longer than {MAX_SPEC_CHARS} characters")
    lowered = text.lower()
    if lowered in ("startup", "@reboot"):
        return StartupSchedule()
    if lowered.startswith("every"):
        return _parse_every(lowered, text)
    if lowered.startswith("daily"):
        match = _DAILY.match(lowered)
        if not match:
            raise InvalidArgument(f"schedule {text!r}: write a daily time as 'daily HH:MM', e.g. 'daily 09:00'")
        hour, minute = int(match.group(1)), int(match.group(2))
        if hour > 23 or minute > 59:
            raise InvalidArgument(f"schedule {text!r}: {hour:02d}:{minute:02d} is not a time of day (00:00-23:59)")
        return CronSchedule(f"{minute} {hour} * * *")
    if lowered.startswith("hourly"):
        match = _HOURLY.match(lowered)
        if not match:
            raise InvalidArgument(f"schedule {text!r}: write an hourly minute as 'hourly :MM', e.g. 'hourly :15'")
        minute = int(match.group(1))
        if minute > 59:
            raise InvalidArgument(f"schedule {text!r}: minute {minute} is out of range (0-59)")
        return CronSchedule(f"{minute} * * * *")
    if lowered.startswith("@"):
        if lowered not in _MACROS:
            raise InvalidArgument(
                f"schedule {text!r}: unknown shorthand; known ones are {', '.join(sorted(_MACROS))} and @reboot"
            )
        return CronSchedule(_MACROS[lowered])
    return _parse_cron(text)


def _parse_every(lowered: str, text: str) -> IntervalSchedule:
    match = _EVERY.match(lowered)
    if not match or match.group(2) not in _UNITS:
        raise InvalidArgument(
            f"schedule {text!r}: write an interval as 'every N' plus a unit s, m, h or d, e.g. 'every 30s' or 'every 2h'"
        )
    seconds = int(match.group(1)) * _UNITS[match.group(2)]
    if seconds < 1:
        raise InvalidArgument(f"schedule {text!r}: the interval must be at least 1 second")
    if seconds > MAX_INTERVAL_S:
        raise InvalidArgument(f"schedule {text!r}: the interval must be at most 366 days")
    return IntervalSchedule(seconds)


def _parse_cron(text: str) -> CronSchedule:
    fields = text.split()
    if len(fields) != 5:
        raise InvalidArgument(
            f"schedule {text!r} has {len(fields)} field(s); a cron expression has exactly 5: "
            "minute hour day-of-month month day-of-week (e.g. '30 9 * * 1-5'), "
            "or use 'every 10m', 'daily 09:00', 'hourly :15', 'startup'"
        )
    for name, value in zip(_FIELD_NAMES, fields, strict=True):
        if not re.fullmatch(r"[0-9A-Za-z*/,\-?LW#]+", value):
            raise InvalidArgument(f"schedule {text!r}: the {name} field {value!r} contains characters cron does not use")
    try:
        schedule = CronSchedule(text)
        # Computing a due time proves the expression can ever match (e.g. '0 0 30 2 *' cannot).
        croniter(text, datetime(2000, 1, 1, tzinfo=ZoneInfo("UTC"))).get_next(float)
    except CroniterBadDateError:
        raise InvalidArgument(f"schedule {text!r} never matches a real date (e.g. February 30th or April 31st)") from None
    except (CroniterError, ValueError, KeyError) as exc:
        raise InvalidArgument(f"schedule {text!r} is not a valid cron expression: {_explain(exc, fields)}") from None
    return schedule


def _explain(exc: Exception, fields: list[str]) -> str:
    message = str(exc)
    ranges = ("0-59", "0-23", "1-31", "1-12 or JAN-DEC", "0-7 or SUN-SAT")
    for index, (name, value) in enumerate(zip(_FIELD_NAMES, fields, strict=True)):
        try:
            croniter(" ".join(v if i == index else "*" for i, v in enumerate(fields)))
        except Exception:  # noqa: BLE001 - probing which field croniter refuses
            return f"the {name} field {value!r} is out of range or malformed (allowed: {ranges[index]})"
    return message
