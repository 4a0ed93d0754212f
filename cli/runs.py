"""`agentmesh runs list|show|join|cancel`: turns as resources (docs/api.md, "Runs") — a run
started with `agentmesh chat --submit MESSAGE` runs on in the platform; these read, follow and
stop it from any shell, through any gateway replica.

gRPC and the stubs are imported when a command runs, so `agentmesh runs --help` loads neither.
"""

from __future__ import annotations

import argparse
import time

from agentmesh.cli.common import EXIT_OK

STATES = ("queued", "running", "waiting_for_approval", "succeeded", "failed", "cancelled", "interrupted")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def register(subparsers) -> None:
    runs = subparsers.add_parser("runs", help="list, show, join or cancel runs (turns started with chat --submit)")
    verbs = runs.add_subparsers(dest="verb", required=True)
    listing = verbs.add_parser("list", help="a namespace's runs, newest first")
    listing.add_argument("--session", default="", help="only this session's runs")
    listing.add_argument("--namespace", default="", help="default: your own")
    listing.add_argument("--state", action="append", default=[], choices=STATES, help="only runs in this state; repeatable")
    listing.add_argument("--since", type=_age, default=0.0, metavar="AGE",
                         help="only runs created in the last AGE (e.g. 30m, 2h, 7d)")
    listing.add_argument("--limit", type=int, default=50, help="at most this many (1-500)")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=list_runs)
    for verb, help_text, func in (("show", "one run's record", show_run),
                                  ("join", "follow a run's events from its start (or --after SEQ) to its end", join_run),
                                  ("cancel", "stop a running run", cancel_run)):
        parser = verbs.add_parser(verb, help=help_text)
        parser.add_argument("run_id")
        parser.add_argument("--json", action="store_true")
        if verb == "join":
            parser.add_argument("--after", type=int, default=0, metavar="SEQ", help="only the events after this seq")
        parser.set_defaults(func=func)


def _age(text: str) -> float:
    unit = _UNITS.get(text[-1:], 0)
    try:
        value = float(text[:-1]) * unit if unit else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an age like 30m, 2h or 7d") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("an age is more than 0 (30m, 2h, 7d)")
    return time.time() - value


def _line(run) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.created_at))
    usage = f"{run.usage.total_tokens} tokens" if run.usage.total_tokens else "-"
    stop = f" ({run.stop_reason})" if run.stop_reason else (f" ({run.error_reason})" if run.error_reason else "")
    return f"{run.run_id}  {run.state}{stop}  {when}  {run.session_id}  {usage}"


async def _call(settings, method: str, request):
    from agentmesh.cli.common import gateway_call

    return await gateway_call(method, request, settings=settings, timeout=60)


async def list_runs(args) -> int:
    from agentmesh.cli.common import CliError, load_settings, print_json, to_dict
    from agentmesh.v1 import gateway_pb2

    if not 1 <= args.limit <= 500:
        raise CliError("--limit is between 1 and 500", 2)
    settings = load_settings()
    reply = await _call(settings, "ListRuns", gateway_pb2.ListTurnRunsRequest(
        namespace=args.namespace, session_id=args.session, states=args.state, created_after=args.since,
        page_size=args.limit))
    if args.json:
        print_json([to_dict(r) for r in reply.runs])
    elif not reply.runs:
        print("no runs")
    else:
        for run in reply.runs:
            print(_line(run))
    return EXIT_OK


async def show_run(args) -> int:
    from agentmesh.cli.common import load_settings, print_json, to_dict
    from agentmesh.v1 import gateway_pb2

    run = await _call(load_settings(), "GetRun", gateway_pb2.GetRunRequest(run_id=args.run_id))
    if args.json:
        print_json(to_dict(run))
    else:
        print(_line(run))
        if run.error_message:
            print(f"error: {run.error_message}")
    return EXIT_OK


async def cancel_run(args) -> int:
    from agentmesh.cli.common import load_settings, print_json, to_dict
    from agentmesh.v1 import gateway_pb2

    run = await _call(load_settings(), "CancelRun", gateway_pb2.CancelRunRequest(run_id=args.run_id))
    if args.json:
        print_json(to_dict(run))
    else:
        print(_line(run))
    return EXIT_OK


async def join_run(args) -> int:
    """The run's events as `chat` shows a turn's; Ctrl-C cancels the run; the exit code is the turn's."""
    from agentmesh.cli.chat_turns import stream_turn
    from agentmesh.cli.common import call_metadata, channel_to, load_settings, print_json
    from agentmesh.cli.render import HumanRenderer, event_to_json
    from agentmesh.clients.gateway import GatewayClient
    from agentmesh.v1 import gateway_pb2

    settings = load_settings()
    run = await _call(settings, "GetRun", gateway_pb2.GetRunRequest(run_id=args.run_id))
    render = (lambda e: print_json(event_to_json(e))) if args.json else HumanRenderer(approval_hint=True)
    async with channel_to(settings, "gateway") as channel:
        stub = GatewayClient(channel).stub
        call = stub.JoinRun(gateway_pb2.JoinRunRequest(run_id=args.run_id, after_seq=args.after),
                            metadata=call_metadata(settings))
        return await stream_turn(stub, settings, gateway_pb2.ChatRequest(session_id=run.session_id), render, call=call)


async def submit(args, request) -> int:
    """`agentmesh chat --submit MESSAGE`: start the run, print its id, and return at once."""
    from agentmesh.cli.common import load_settings, print_json, to_dict
    from agentmesh.v1 import gateway_pb2

    run = await _call(load_settings(), "CreateRun", gateway_pb2.CreateRunRequest(
        session_id=request.session_id, message=request.message, options=request.options))
    if args.json:
        print_json(to_dict(run))
    else:
        print(run.run_id)
    return EXIT_OK
