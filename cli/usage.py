"""`agentmesh usage`: what the model calls cost, by day, model, session or namespace
(Gateway.GetUsage)."""

from __future__ import annotations

import datetime as dt

from agentmesh.cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    gateway_call,
    print_json,
)
from agentmesh.v1 import gateway_pb2

RANGES = ("today", "7d", "30d", "all")
GROUPS = ("day", "model", "session", "namespace")


def register(subparsers) -> None:
    usage = subparsers.add_parser(
        "usage", help="token usage and estimated cost of model calls",
        description="Token usage of every model call (sub-agents', summaries' and fallbacks' included), "
                    "with cost estimates for models that have prices (agentmesh models). Days are UTC.")
    usage.add_argument("--range", choices=RANGES, default=None, help="today, 7d (default), 30d or all")
    usage.add_argument("--since", metavar="WHEN", help="start: YYYY-MM-DD or an ISO time (UTC unless it says)")
    usage.add_argument("--until", metavar="WHEN", help="end, exclusive: YYYY-MM-DD or an ISO time (default: now)")
    usage.add_argument("--by", choices=GROUPS, default="day", help="group by day (default), model, session or namespace")
    usage.add_argument("--json", action="store_true", help="print the answer as JSON")
    usage.set_defaults(func=show_usage)


def _time(text: str, what: str) -> float:
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise CliError(f"{what} {text!r} is not a date (YYYY-MM-DD) or an ISO time", EXIT_USAGE) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def _tokens(n: int) -> str:
    return f"{n:,}"


def _cost(group: gateway_pb2.UsageGroup) -> str:
    if not group.cost and not group.cost_complete:
        return "-"
    return f"${group.cost:,.4f}" + ("" if group.cost_complete else "+")


def _day(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M")


async def show_usage(args) -> int:
    if args.range and (args.since or args.until):
        raise CliError("give either --range or --since/--until, not both", EXIT_USAGE)
    request = gateway_pb2.GetUsageRequest(
        range=args.range or ("" if args.since or args.until else "7d"), group_by=args.by,
        start=_time(args.since, "--since") if args.since else 0.0,
        end=_time(args.until, "--until") if args.until else 0.0,
    )
    reply = await gateway_call("GetUsage", request, timeout=60)
    if args.json:
        def group(g: gateway_pb2.UsageGroup) -> dict:
            return {"key": g.key, "calls": g.calls, "input_tokens": g.input_tokens, "output_tokens": g.output_tokens,
                    "cached_input_tokens": g.cached_input_tokens, "total_tokens": g.total_tokens,
                    "fallback_calls": g.fallback_calls, "cost": round(g.cost, 6), "cost_complete": g.cost_complete}

        print_json({"start": reply.start, "end": reply.end, "group_by": reply.group_by,
                    "groups": [group(g) for g in reply.groups], "total": group(reply.total)})
        return EXIT_OK
    print(f"usage from {_day(reply.start) if reply.start else 'the first call'} to {_day(reply.end)} UTC, by {reply.group_by}")
    header = (reply.group_by.upper(), "CALLS", "INPUT", "CACHED", "OUTPUT", "TOTAL", "COST")
    rows = [header]
    for g in [*reply.groups, reply.total]:
        rows.append((g.key if g is not reply.total else "total", str(g.calls), _tokens(g.input_tokens),
                     _tokens(g.cached_input_tokens), _tokens(g.output_tokens), _tokens(g.total_tokens), _cost(g)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for index, row in enumerate(rows):
        if index == len(rows) - 1:
            print("  ".join("-" * w for w in widths))
        cells = [row[0].ljust(widths[0]), *(cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True))]
        print("  ".join(cells).rstrip())
    notes = []
    if reply.total.fallback_calls:
        notes.append(f"{reply.total.fallback_calls} call(s) answered by a fallback model")
    if not reply.total.cost_complete and reply.total.calls:
        notes.append("'+' or '-': some models have no prices configured (AGENTMESH_MODELS prices), so cost is a lower bound")
    for note in notes:
        print(note)
    return EXIT_OK
