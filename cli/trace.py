"""`agentmesh trace show [TRACE_ID|--last] [--json]` and `agentmesh trace list`: the local span store.

Reads `$AGENTMESH_HOME/traces/` directly, so it works with the stack stopped. In a cluster,
traces go to a collector instead (AGENTMESH_TRACES=otlp) and are read in Jaeger/Tempo/Grafana.
"""

from __future__ import annotations

import shutil
import sys
import time

from agentmesh.cli.common import EXIT_OK, EXIT_SERVER_ERROR, EXIT_USAGE, CliError, load_settings, print_json
from agentmesh.telemetry.spanstore import span_store_dir
from agentmesh.telemetry.traceview import (
    AmbiguousTraceId,
    TraceNotFound,
    TraceView,
    format_duration,
    last_trace_id,
    load_trace,
    recent_traces,
    render_waterfall,
    short_service,
)


def register(subparsers) -> None:
    trace = subparsers.add_parser("trace", help="show the traces of recent turns (local span store)")
    verbs = trace.add_subparsers(dest="verb", required=True)
    show = verbs.add_parser("show", help="draw one trace as a waterfall (default: the latest)")
    show.add_argument("trace_id", nargs="?", help="a trace id, or a unique prefix of at least 8 characters")
    show.add_argument("--last", action="store_true", help="the trace whose root span ended last")
    show.add_argument("--json", action="store_true", help="print the spans as JSON instead")
    show.set_defaults(func=show_trace)
    listing = verbs.add_parser("list", help="the latest traces, newest first")
    listing.add_argument("--limit", type=int, default=20, help="how many (default 20)")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=list_traces)


def _store():
    settings = load_settings()
    if settings.traces != "local":
        sys.stderr.write(
            f"agentmesh: note: AGENTMESH_TRACES={settings.traces}, so new spans are not kept locally\n"
        )
    return span_store_dir(settings.home)


def _resolve(args) -> TraceView:
    if args.trace_id and args.last:
        raise CliError("give a trace id or --last, not both", EXIT_USAGE)
    directory = _store()
    trace_id = args.trace_id
    if not trace_id:
        trace_id = last_trace_id(directory)
        if trace_id is None:
            raise CliError(f"no traces yet in {directory}: run a turn first (agentmesh chat \"hello\")")
    try:
        return load_trace(directory, trace_id)
    except ValueError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    except (TraceNotFound, AmbiguousTraceId) as exc:
        raise CliError(str(exc), EXIT_SERVER_ERROR) from None


def _width() -> int:
    return max(shutil.get_terminal_size((120, 24)).columns, 60)


def _ascii_only() -> bool:
    try:
        "█└├│…·".encode(sys.stdout.encoding or "ascii")
    except (UnicodeEncodeError, LookupError):
        return True
    return False


async def show_trace(args) -> int:
    view = _resolve(args)
    if args.json:
        print_json(view.spans)
    else:
        print(render_waterfall(view, width=_width(), ascii_only=_ascii_only()))
    return EXIT_OK


async def list_traces(args) -> int:
    if args.limit < 1:
        raise CliError("--limit must be at least 1", EXIT_USAGE)
    traces = recent_traces(_store(), args.limit)
    if args.json:
        print_json(traces)
        return EXIT_OK
    if not traces:
        print("no traces yet — run a turn first: agentmesh chat \"hello\"")
        return EXIT_OK
    print(f"{'TRACE':<32}  {'ENDED':<19}  {'DURATION':>10}  {'SPANS':>5}  {'ERRORS':>6}  ROOT")
    for t in traces:
        ended = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t["end"]))
        root = f"{short_service(t['service'])} {t['name']}".strip() or "(root not recorded)"
        print(f"{t['trace_id']:<32}  {ended:<19}  {format_duration(t['end'] - t['start']):>10}  "
              f"{t['spans']:>5}  {t['errors']:>6}  {root}")
    return EXIT_OK


def print_trace(trace_id: str) -> bool:
    """Draw one trace (used by `agentmesh demo`); False with a note on stderr when it is not stored."""
    directory = span_store_dir(load_settings().home)
    try:
        view = load_trace(directory, trace_id)
    except (ValueError, TraceNotFound, AmbiguousTraceId) as exc:
        sys.stderr.write(f"agentmesh: {exc}\n")
        return False
    print(render_waterfall(view, width=_width(), ascii_only=_ascii_only()))
    return True
