"""Schedule specs on their own: every form, timezones, DST and the calendar edge cases of cron."""

from __future__ import annotations

import itertools
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from agentmesh.errors import InvalidArgument
from agentmesh.scheduler.schedules import (
    CronSchedule,
    IntervalSchedule,
    StartupSchedule,
    load_timezone,
    parse_schedule,
)

UTC = ZoneInfo("UTC")
NEW_YORK = ZoneInfo("America/New_York")
BERLIN = ZoneInfo("Europe/Berlin")


def upcoming(spec: str, start: datetime, count: int, tz: ZoneInfo | None = None, anchor: float | None = None):
    """The next `count` due times after `start`, as wall-clock datetimes in `tz`."""
    tz = tz or start.tzinfo
    schedule = parse_schedule(spec)
    t, out = start.timestamp(), []
    for _ in range(count):
        t = schedule.next_after(t, tz, start.timestamp() if anchor is None else anchor)
        out.append(datetime.fromtimestamp(t, tz))
    return out


def at(tz, *fields, fold=0):
    return datetime(*fields, tzinfo=tz, fold=fold)


# --- the forms ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("*/5 * * * *", CronSchedule("*/5 * * * *")),
        ("  30   9 * * 1-5 ", CronSchedule("30 9 * * 1-5")),
        ("every 30s", IntervalSchedule(30)),
        ("every 10m", IntervalSchedule(600)),
        ("every 2h", IntervalSchedule(7200)),
        ("every 1d", IntervalSchedule(86400)),
        ("EVERY 5 m", IntervalSchedule(300)),
        ("daily 09:00", CronSchedule("0 9 * * *")),
        ("daily 9:05", CronSchedule("5 9 * * *")),
        ("hourly :15", CronSchedule("15 * * * *")),
        ("hourly 45", CronSchedule("45 * * * *")),
        ("@hourly", CronSchedule("0 * * * *")),
        ("@weekly", CronSchedule("0 0 * * 0")),
        ("startup", StartupSchedule()),
        ("@reboot", StartupSchedule()),
    ],
)
def test_every_form_parses(spec, expected):
    assert parse_schedule(spec) == expected


def test_every_counts_from_the_anchor_so_restarts_keep_the_phase():
    start = at(UTC, 2026, 1, 5, 0, 0, 7)
    assert upcoming("every 30s", start, 3) == [
        at(UTC, 2026, 1, 5, 0, 0, 37), at(UTC, 2026, 1, 5, 0, 1, 7), at(UTC, 2026, 1, 5, 0, 1, 37)]
    schedule = parse_schedule("every 10m")
    anchor = start.timestamp()
    # Asked from any point between two due times, the answer is the next one on the grid.
    assert schedule.next_after(anchor + 601, UTC, anchor) == anchor + 1200
    assert schedule.next_after(anchor + 1200, UTC, anchor) == anchor + 1800
    assert schedule.latest_at_or_before(anchor + 1799, UTC, anchor) == anchor + 1200
    assert schedule.latest_at_or_before(anchor + 599, UTC, anchor) is None


def test_daily_and_hourly_follow_the_wall_clock():
    start = at(UTC, 2026, 1, 5, 9, 30)
    assert upcoming("daily 09:00", start, 2) == [at(UTC, 2026, 1, 6, 9), at(UTC, 2026, 1, 7, 9)]
    assert upcoming("hourly :15", start, 3) == [
        at(UTC, 2026, 1, 5, 10, 15), at(UTC, 2026, 1, 5, 11, 15), at(UTC, 2026, 1, 5, 12, 15)]


def test_startup_never_comes_due_on_the_clock():
    assert parse_schedule("startup").next_after(0.0, UTC, 0.0) is None


# --- timezones and DST -------------------------------------------------------------------


def test_daily_time_is_in_the_jobs_timezone():
    start = at(UTC, 2026, 1, 5, 0, 0)
    (due,) = upcoming("daily 09:00", start, 1, tz=BERLIN)
    assert due == at(BERLIN, 2026, 1, 5, 9, 0)
    assert due.astimezone(UTC).hour == 8  # CET is UTC+1 in January


def test_spring_forward_runs_a_skipped_time_once_right_after_the_jump():
    # 8 March 2026, New York: 02:00 EST jumps to 03:00 EDT, so 02:30 does not exist that day.
    due = upcoming("daily 02:30", at(NEW_YORK, 2026, 3, 7, 12, 0), 3)
    assert due == [at(NEW_YORK, 2026, 3, 8, 3, 0), at(NEW_YORK, 2026, 3, 9, 2, 30), at(NEW_YORK, 2026, 3, 10, 2, 30)]
    # Real time between the runs is what the clocks say, DST included: 23 h then 23.5 h.
    assert due[1].timestamp() - due[0].timestamp() == 23.5 * 3600


def test_fall_back_runs_a_repeated_time_once():
    # 1 November 2026, New York: 02:00 EDT falls back to 01:00 EST, so 01:30 happens twice.
    due = upcoming("daily 01:30", at(NEW_YORK, 2026, 10, 31, 12, 0), 3)
    assert due[0] == at(NEW_YORK, 2026, 11, 1, 1, 30, fold=0)
    assert due[0].utcoffset().total_seconds() == -4 * 3600  # the first (EDT) pass only
    assert due[1] == at(NEW_YORK, 2026, 11, 2, 1, 30)
    assert due[1].timestamp() - due[0].timestamp() == 25 * 3600


def test_fall_back_keeps_both_real_hours_for_wildcard_hours():
    due = upcoming("*/30 * * * *", at(NEW_YORK, 2026, 11, 1, 0, 50), 6)
    offsets = [int(d.utcoffset().total_seconds() // 3600) for d in due]
    assert [(d.hour, d.minute) for d in due] == [(1, 0), (1, 30), (1, 0), (1, 30), (2, 0), (2, 30)]
    assert offsets == [-4, -4, -5, -5, -5, -5]
    # Evenly spaced in real time: no run lost, none doubled.
    assert {b.timestamp() - a.timestamp() for a, b in itertools.pairwise(due)} == {1800}


def test_latest_due_time_skips_the_repeated_pass_too():
    schedule = parse_schedule("daily 01:30")
    after_fallback = at(NEW_YORK, 2026, 11, 1, 3, 0).timestamp()
    latest = datetime.fromtimestamp(schedule.latest_at_or_before(after_fallback, NEW_YORK), NEW_YORK)
    assert latest.utcoffset().total_seconds() == -4 * 3600


def test_interval_ignores_dst_it_is_real_time():
    due = upcoming("every 1d", at(NEW_YORK, 2026, 3, 7, 12, 0), 2)
    assert due[1].timestamp() - due[0].timestamp() == 86400
    assert due[0].hour == 13  # 24 real hours after noon EST is 13:00 EDT


@pytest.mark.parametrize("name", ["Mars/Olympus", "../../etc/passwd", "UTC+2 ", "x" * 70])
def test_unknown_timezones_are_refused(name):
    with pytest.raises(InvalidArgument, match="timezone"):
        load_timezone(name)


# --- calendar edge cases of cron ---------------------------------------------------------


def test_day_31_only_in_months_that_have_one():
    due = upcoming("0 0 31 * *", at(UTC, 2026, 1, 1), 7)
    assert [(d.month, d.day) for d in due] == [(1, 31), (3, 31), (5, 31), (7, 31), (8, 31), (10, 31), (12, 31)]


def test_february_29_only_in_leap_years():
    due = upcoming("0 12 29 2 *", at(UTC, 2026, 1, 1), 3)
    assert [d.year for d in due] == [2028, 2032, 2036]


def test_day_of_month_and_day_of_week_match_when_either_matches():
    # Vixie cron: "the 13th, and every Friday" — not "Friday the 13th".
    due = upcoming("0 0 13 * 5", at(UTC, 2026, 1, 1), 5)
    assert [d.day for d in due] == [2, 9, 13, 16, 23]
    # With one of the two fields '*', only the other restricts.
    assert [d.day for d in upcoming("0 0 * * 5", at(UTC, 2026, 1, 1), 3)] == [2, 9, 16]


def test_last_day_of_month_via_l():
    due = upcoming("0 0 L * *", at(UTC, 2028, 1, 15), 2)
    assert [(d.month, d.day) for d in due] == [(1, 31), (2, 29)]


def test_sunday_is_both_0_and_7_and_names_work():
    sundays = upcoming("0 8 * * 0", at(UTC, 2026, 1, 1), 2)
    assert upcoming("0 8 * * 7", at(UTC, 2026, 1, 1), 2) == sundays
    assert upcoming("0 8 * * SUN", at(UTC, 2026, 1, 1), 2) == sundays
    assert all(d.weekday() == 6 for d in sundays)


def test_new_years_across_the_year_boundary():
    assert upcoming("@yearly", at(UTC, 2026, 12, 31, 23, 59), 1) == [at(UTC, 2027, 1, 1)]


# --- refusals ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("", "schedule is empty"),
        ("* * * *", "has 4 field"),
        ("* * * * * *", "has 6 field"),
        ("61 * * * *", "minute field '61'"),
        ("0 24 * * *", "hour field '24'"),
        ("0 0 0 * *", "day of month field '0'"),
        ("0 0 1 13 *", "month field '13'"),
        ("0 0 * * 8", "day of week field '8'"),
        ("*/0 * * * *", "minute field '\\*/0'"),
        ("0 0 30 2 *", "never matches a real date"),
        ("0 0 31 4 *", "never matches a real date"),
        ("0 0 $ * *", "characters cron does not use"),
        ("every 0s", "at least 1 second"),
        ("every 5x", "unit s, m, h or d"),
        ("every", "unit s, m, h or d"),
        ("every 400d", "at most 366 days"),
        ("daily 25:00", "not a time of day"),
        ("daily 9am", "'daily HH:MM'"),
        ("hourly :75", "minute 75 is out of range"),
        ("hourly quarter", "'hourly :MM'"),
        ("@fortnightly", "unknown shorthand"),
        ("x" * 201, "longer than 200"),
    ],
)
def test_invalid_schedules_say_what_is_wrong(spec, says):
    with pytest.raises(InvalidArgument, match=says):
        parse_schedule(spec)
