"""`agentmesh reflect SESSION` (one reflection now, through the gateway) and
`agentmesh reflect history` (the runs, kept by the memory service, through the gateway)."""

from __future__ import annotations

import datetime as dt

import grpc

from agentmesh.cli.common import EXIT_OK, call_metadata, channel_to, load_settings, print_json, rpc_failure, to_dict
from agentmesh.clients.gateway import GatewayClient
from agentmesh.v1 import learning_pb2


def register(subparsers) -> None:
    reflect = subparsers.add_parser(
        "reflect", help="reflect on a session now (knowledge, learnings, skill drafts); 'history' lists the runs")
    reflect.add_argument("session", help="a session id, or 'history'")
    reflect.add_argument("--namespace", default="default", help="history: the namespace")
    reflect.add_argument("--session", dest="only_session", default="", help="history: one session's runs")
    reflect.add_argument("--limit", type=int, default=20)
    reflect.add_argument("--json", action="store_true")
    reflect.set_defaults(func=run)


def describe(r) -> str:
    when = dt.datetime.fromtimestamp(r.started_at, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
    span = f"seq {r.seq_from}-{r.seq_to}" if r.seq_to else "no entries"
    line = (f"{when}  {r.session_id}  {r.status} ({r.trigger})  {span}  +{r.added} added, {r.superseded} superseded, "
            f"{r.unchanged} unchanged, {r.skill_drafts} skill drafts  {r.model_calls} model calls, "
            f"{r.input_tokens}+{r.output_tokens} tokens")
    return line + (f"  error: {r.error}" if r.error else "")


async def run(args) -> int:
    settings = load_settings()
    if args.session == "history":
        async with channel_to(settings, "gateway") as channel:
            request = learning_pb2.ListReflectionsRequest(namespace=args.namespace, session_id=args.only_session,
                                                          limit=args.limit)
            try:
                reply = await GatewayClient(channel).stub.ListReflections(
                    request, metadata=call_metadata(settings), timeout=30)
            except grpc.aio.AioRpcError as err:
                raise rpc_failure(err, "gateway", settings) from None
        if args.json:
            print_json([to_dict(r) for r in reply.runs])
        elif not reply.runs:
            print("no reflections yet")
        else:
            for r in reply.runs:
                print(describe(r))
        return EXIT_OK
    async with channel_to(settings, "gateway") as channel:
        try:
            reply = await GatewayClient(channel).stub.Reflect(
                learning_pb2.ReflectRequest(session_id=args.session), metadata=call_metadata(settings), timeout=330)
        except grpc.aio.AioRpcError as err:
            raise rpc_failure(err, "gateway", settings) from None
    if args.json:
        print_json(to_dict(reply.run))
    else:
        print(describe(reply.run))
    return EXIT_OK
