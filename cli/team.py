"""`agentmesh team SESSION`: a lead session's team (docs/teams.md) — each teammate's state,
current task, last message and tokens, and the shared board; `team SESSION message TO TEXT`
sends a message into a member's mailbox (a teammate's name, or `lead`); `team SESSION stop
[NAME]` stops one teammate, or all of them. A person in the lead's place: `team SESSION approve
NAME REQUEST [NOTE…]` and `reject NAME REQUEST [NOTE…]` answer a teammate's plan request, `team
SESSION shutdown NAME [NOTE…]` asks it to stop (the shutdown protocol)."""

from __future__ import annotations

from agentmesh.cli.common import EXIT_OK, EXIT_USAGE, gateway_call, print_json

__all__ = ["register"]


def register(subparsers) -> None:
    team = subparsers.add_parser("team", help="a lead session's teammates: show, message, stop")
    team.add_argument("session_id", help="the lead's session")
    team.add_argument("action", nargs="?", default="show", choices=("show", "message", "stop", "approve", "reject", "shutdown"))
    team.add_argument("rest", nargs="*", help="message: TO TEXT…; stop: [NAME]; approve|reject: NAME REQUEST [NOTE…]; "
                      "shutdown: NAME [NOTE…]")
    team.add_argument("--json", action="store_true", help="the team as JSON (show)")
    team.set_defaults(func=run_team)


async def run_team(args) -> int:
    from agentmesh.v1 import gateway_pb2

    if args.action == "message":
        if len(args.rest) < 2:
            print("usage: agentmesh team SESSION message TO TEXT…")
            return EXIT_USAGE
        reply = await gateway_call("SendTeamMessage", gateway_pb2.SendTeamMessageRequest(
            session_id=args.session_id, to=args.rest[0], text=" ".join(args.rest[1:])))
        print(f"sent to {args.rest[0]} (message {reply.seq} of its inbox)")
        return EXIT_OK
    if args.action in ("approve", "reject"):
        if len(args.rest) < 2:
            print(f"usage: agentmesh team SESSION {args.action} NAME REQUEST [NOTE…]")
            return EXIT_USAGE
        reply = await gateway_call("SendTeamMessage", gateway_pb2.SendTeamMessageRequest(
            session_id=args.session_id, to=args.rest[0], request_id=args.rest[1], approve=args.action == "approve",
            text=" ".join(args.rest[2:])))
        print(f"plan {reply.request_id} of {args.rest[0]}: {reply.state}")
        return EXIT_OK
    if args.action == "shutdown":
        if not args.rest:
            print("usage: agentmesh team SESSION shutdown NAME [NOTE…]")
            return EXIT_USAGE
        reply = await gateway_call("SendTeamMessage", gateway_pb2.SendTeamMessageRequest(
            session_id=args.session_id, to=args.rest[0], shutdown=True, text=" ".join(args.rest[1:])))
        print(f"asked {args.rest[0]} to stop: request {reply.request_id} ({reply.state}); its answer goes to the "
              "lead's inbox")
        return EXIT_OK
    if args.action == "stop":
        name = args.rest[0] if args.rest else ""
        reply = await gateway_call("StopTeammates", gateway_pb2.StopTeammatesRequest(session_id=args.session_id,
                                                                                     name=name))
        print(f"stopped: {', '.join(reply.stopped)}" if reply.stopped else "no running teammate to stop")
        return EXIT_OK
    team = await gateway_call("GetTeam", gateway_pb2.GetTeamRequest(session_id=args.session_id))
    if args.json:
        from google.protobuf import json_format

        print_json(json_format.MessageToDict(team, preserving_proto_field_name=True))
        return EXIT_OK
    if not team.teammates:
        print(f"session {args.session_id} has no teammates")
        return EXIT_OK
    for m in team.teammates:
        task = m.current_task or "-"
        last = " ".join(m.last_message.split())[:80] or "-"
        print(f"{m.name:<12} {m.state:<9} {m.usage.total_tokens:>8} tokens  task: {task}  last: {last}")
    for t in team.tasks:
        owner = f" @{t.owner}" if t.owner else ""
        print(f"  #{t.id} {t.subject}{owner} — {t.status}")
    return EXIT_OK
