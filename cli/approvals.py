"""`agentmesh approvals list --session ID` and `approvals approve|deny CALL_ID --session ID
[--note TEXT]`: see and decide the tool calls a running turn holds for approval."""

from __future__ import annotations

import grpc

from agentmesh.cli.common import EXIT_OK, call_metadata, channel_to, load_settings, print_json, rpc_failure, to_dict
from agentmesh.clients.gateway import GatewayClient
from agentmesh.config import Settings
from agentmesh.v1 import gateway_pb2, gateway_pb2_grpc


def register(subparsers) -> None:
    approvals = subparsers.add_parser("approvals", help="approve or deny a tool call a running turn waits on")
    verbs = approvals.add_subparsers(dest="verb", required=True)
    listing = verbs.add_parser("list", help="the calls the session's running turn waits on")
    listing.add_argument("--session", required=True)
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=list_pending)
    for verb, help_text in (("approve", "let the held call run"), ("deny", "refuse the held call; the model is told why")):
        parser = verbs.add_parser(verb, help=help_text)
        parser.add_argument("call_id", help="the call_id of the approval_request event")
        parser.add_argument("--session", required=True, help="the session whose turn holds the call")
        parser.add_argument("--note", default="", help="words for the model, e.g. why the call is denied")
        parser.add_argument("--json", action="store_true")
        if verb == "approve":
            parser.add_argument("--rest-of-turn", action="store_true",
                                help="also approve every other call this turn holds now or later (the next turn asks again)")
            parser.add_argument("--arguments", default="", metavar="JSON",
                                help="run the call with these arguments instead of the model's (a JSON object, "
                                     "checked against the tool's schema)")
        parser.set_defaults(func=decide, approved=verb == "approve", rest_of_turn=False, arguments="")


async def send_decision(stub: gateway_pb2_grpc.GatewayStub, settings: Settings, session_id: str, call_id: str,
                        approved: bool, note: str = "", rest_of_turn: bool = False,
                        arguments_json: str = "") -> gateway_pb2.ApproveResponse:
    request = gateway_pb2.ApproveRequest(session_id=session_id, call_id=call_id, approved=approved, note=note,
                                         rest_of_turn=rest_of_turn, arguments_json=arguments_json)
    try:
        return await stub.Approve(request, metadata=call_metadata(settings), timeout=30)
    except grpc.aio.AioRpcError as err:
        raise rpc_failure(err, "gateway", settings) from None


async def decide(args) -> int:
    settings = load_settings()
    async with channel_to(settings, "gateway") as channel:
        answer = await send_decision(GatewayClient(channel).stub, settings, args.session, args.call_id,
                                     args.approved, args.note, args.rest_of_turn, args.arguments)
    word = ("approved with the rest of the turn" if args.rest_of_turn else "approved") if args.approved else "denied"
    if args.json:
        print_json({"call_id": args.call_id, "session_id": args.session, "decision": word,
                    "accepted": answer.accepted, "run_id": answer.run_id})
    else:
        print(f"{word} {args.call_id} (run {answer.run_id} on session {args.session})")
    return EXIT_OK


async def list_pending(args) -> int:
    settings = load_settings()
    async with channel_to(settings, "gateway") as channel:
        stub = GatewayClient(channel).stub
        try:
            reply = await stub.ListApprovals(gateway_pb2.ListApprovalsRequest(session_id=args.session),
                                             metadata=call_metadata(settings), timeout=30)
        except grpc.aio.AioRpcError as err:
            raise rpc_failure(err, "gateway", settings) from None
    if args.json:
        print_json([to_dict(a) for a in reply.approvals])
        return EXIT_OK
    if not reply.approvals:
        print(f"nothing waits for approval on session {args.session}")
        return EXIT_OK
    for a in reply.approvals:
        arguments = a.arguments_json if len(a.arguments_json) <= 200 else a.arguments_json[:200] + "…"
        print(f"{a.call_id}  {a.name} {arguments}")
    print(f"decide with: agentmesh approvals approve|deny CALL_ID --session {args.session} [--note TEXT]")
    return EXIT_OK
