"""`agentmesh sessions list|show|search|delete|fork|set-model|set-mode|set-tools`, through the gateway."""

from __future__ import annotations

import time

import grpc

from agentmesh.cli.common import EXIT_OK, call_metadata, channel_to, load_settings, print_json, rpc_failure, to_dict
from agentmesh.clients.gateway import GatewayClient
from agentmesh.v1 import common_pb2, sessions_pb2


def register(subparsers) -> None:
    sessions = subparsers.add_parser("sessions", help="list, show, search, fork or delete sessions")
    verbs = sessions.add_subparsers(dest="verb", required=True)
    listing = verbs.add_parser("list", help="all sessions, newest first")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=list_sessions)
    show = verbs.add_parser("show", help="a session and its transcript")
    show.add_argument("session_id")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=show_session)
    search = verbs.add_parser("search", help="find what was said in a namespace's conversations")
    search.add_argument("query")
    search.add_argument("--namespace", default="default")
    search.add_argument("--session", default="", help="only this session's messages")
    search.add_argument("--since", default="", help="only messages from this time on (ISO 8601, e.g. 2026-11-01)")
    search.add_argument("--until", default="", help="only messages before this time (ISO 8601)")
    search.add_argument("--role", choices=("user", "assistant"), default="")
    search.add_argument("--tool", default="", help="only assistant messages that called this tool")
    search.add_argument("--k", type=int, default=5)
    search.add_argument("--json", action="store_true")
    search.set_defaults(func=search_sessions)
    delete = verbs.add_parser("delete", help="delete a session, its transcript and its workspace")
    delete.add_argument("session_id")
    delete.set_defaults(func=delete_session)
    fork = verbs.add_parser("fork", help="a new session from a message of this one, with a copy of its workspace")
    fork.add_argument("session_id")
    fork.add_argument("--at", dest="at_seq", type=int, required=True, metavar="SEQ",
                      help="the last message the fork keeps (the seq `agentmesh sessions show` prints)")
    fork.add_argument("--new-id", default="", help="the fork's session id (default: a new one)")
    fork.add_argument("--title", default="")
    fork.add_argument("--json", action="store_true")
    fork.set_defaults(func=fork_session)
    set_model = verbs.add_parser("set-model", help="the model the session's next turns use (see agentmesh models)")
    set_model.add_argument("session_id")
    set_model.add_argument("model", help="a name from `agentmesh models`; \"\" goes back to the default")
    set_model.set_defaults(func=set_session_model)
    set_mode = verbs.add_parser("set-mode", help="which calls the session's turns hold for approval")
    set_mode.add_argument("session_id")
    set_mode.add_argument("mode", choices=("auto", "normal", "manual", "default"),
                          help="auto: none; normal: every tool not read-only; manual: every call; "
                               "default: the deployment's AGENTMESH_GATEWAY_PERMISSION_MODE")
    set_mode.set_defaults(func=set_session_mode)
    set_tools = verbs.add_parser("set-tools", help="the tools the session's turns may use (replaces its tool policy)")
    set_tools.add_argument("session_id")
    set_tools.add_argument("--allow", action="append", default=[], metavar="TOOL",
                           help="only these tools (names or patterns such as 'docs__*'); repeatable")
    set_tools.add_argument("--deny", action="append", default=[], metavar="TOOL", help="never these tools; repeatable")
    set_tools.set_defaults(func=set_session_tools)


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts)) if ts else "-"


async def list_sessions(args) -> int:
    settings = load_settings()
    async with channel_to(settings, "gateway") as channel:
        stub = GatewayClient(channel).stub
        sessions, token = [], ""
        try:
            while True:
                page = await stub.ListSessions(
                    sessions_pb2.ListSessionsRequest(page_size=200, page_token=token),
                    metadata=call_metadata(settings), timeout=30,
                )
                sessions.extend(page.sessions)
                token = page.next_page_token
                if not token:
                    break
        except grpc.aio.AioRpcError as err:
            raise rpc_failure(err, "gateway", settings) from None
    if args.json:
        print_json([to_dict(s) for s in sessions])
        return EXIT_OK
    if not sessions:
        print("no sessions yet — start one with: agentmesh chat \"hello\" --session work")
        return EXIT_OK
    print(f"{'SESSION':<34} {'MESSAGES':>8}  {'UPDATED':<16}  TITLE")
    for s in sessions:
        print(f"{s.session_id:<34} {s.message_count:>8}  {_when(s.updated_at):<16}  {s.title}")
    return EXIT_OK


async def show_session(args) -> int:
    settings = load_settings()
    async with channel_to(settings, "gateway") as channel:
        stub = GatewayClient(channel).stub
        try:
            session = await stub.GetSession(
                sessions_pb2.GetSessionRequest(session_id=args.session_id), metadata=call_metadata(settings), timeout=30
            )
            messages, after = [], 0
            while True:
                page = await stub.GetTranscript(
                    sessions_pb2.GetTranscriptRequest(session_id=args.session_id, page_size=1000, after_seq=after),
                    metadata=call_metadata(settings), timeout=30,
                )
                messages.extend(page.messages)
                after = page.next_after_seq
                if not after:
                    break
        except grpc.aio.AioRpcError as err:
            raise rpc_failure(err, "gateway", settings) from None
    if args.json:
        print_json({"session": to_dict(session), "messages": [to_dict(m) for m in messages]})
        return EXIT_OK
    print(f"session {session.session_id} · namespace {session.namespace} · created {_when(session.created_at)}")
    for m in messages:
        if m.kind in ("usage", "tasks"):  # the agent's bookkeeping: `agentmesh tasks` shows the board
            continue
        if m.role == "tool":
            print(f"  #{m.seq} [tool {m.name}] {m.content[:300]}")
        elif m.tool_calls:
            calls = ", ".join(f"{c.name}({c.arguments_json[:80]})" for c in m.tool_calls)
            print(f"  #{m.seq} [{m.role}] {m.content}{' ' if m.content else ''}→ {calls}")
        else:
            print(f"  #{m.seq} [{m.role}] {m.content}")
    return EXIT_OK


async def delete_session(args) -> int:
    settings = load_settings()
    async with channel_to(settings, "gateway") as channel:
        try:
            await GatewayClient(channel).stub.DeleteSession(
                sessions_pb2.DeleteSessionRequest(session_id=args.session_id), metadata=call_metadata(settings), timeout=30
            )
        except grpc.aio.AioRpcError as err:
            raise rpc_failure(err, "gateway", settings) from None
    print(f"deleted session {args.session_id}")
    return EXIT_OK


async def fork_session(args) -> int:
    from agentmesh.cli.common import gateway_call

    reply = await gateway_call("ForkSession", sessions_pb2.ForkSessionRequest(
        session_id=args.session_id, at_seq=args.at_seq, new_session_id=args.new_id, title=args.title), timeout=330)
    if args.json:
        print_json(to_dict(reply))
        return EXIT_OK
    print(f"forked session {args.session_id} at message {args.at_seq} into {reply.session.session_id} "
          f"({reply.messages} messages, {reply.workspace_files} workspace files)")
    print(f"continue it: agentmesh chat --session {reply.session.session_id}")
    return EXIT_OK


async def set_session_model(args) -> int:
    settings = load_settings()
    async with channel_to(settings, "gateway") as channel:
        try:
            session = await GatewayClient(channel).stub.UpdateSession(
                sessions_pb2.UpdateSessionRequest(session_id=args.session_id, model=args.model),
                metadata=call_metadata(settings), timeout=30)
        except grpc.aio.AioRpcError as err:
            raise rpc_failure(err, "gateway", settings) from None
    print(f"session {session.session_id} now uses model {session.model or 'default'}")
    return EXIT_OK


async def update_session(request: sessions_pb2.UpdateSessionRequest) -> sessions_pb2.Session:
    settings = load_settings()
    async with channel_to(settings, "gateway") as channel:
        try:
            return await GatewayClient(channel).stub.UpdateSession(
                request, metadata=call_metadata(settings), timeout=30)
        except grpc.aio.AioRpcError as err:
            raise rpc_failure(err, "gateway", settings) from None


async def set_session_mode(args) -> int:
    mode = "" if args.mode == "default" else args.mode
    session = await update_session(sessions_pb2.UpdateSessionRequest(
        session_id=args.session_id, permission_mode=mode,
        update_mask=["permission_mode"]))
    print(f"session {session.session_id} now runs in permission mode {session.permission_mode or 'default'}")
    return EXIT_OK


async def set_session_tools(args) -> int:
    session = await update_session(sessions_pb2.UpdateSessionRequest(
        session_id=args.session_id, tools=common_pb2.ToolPolicy(allow=args.allow, deny=args.deny),
        update_mask=["tools"]))
    print(f"session {session.session_id}: {describe_policy(session.tools)}")
    return EXIT_OK


def describe_policy(policy: common_pb2.ToolPolicy) -> str:
    allow = ", ".join(policy.allow) if policy.allow else "every tool"
    return f"allows {allow}" + (f"; denies {', '.join(policy.deny)}" if policy.deny else "")


def _iso(value: str, flag: str) -> float:
    from datetime import UTC, datetime

    from agentmesh.cli.common import EXIT_USAGE, CliError

    if not value:
        return 0.0
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise CliError(f"{flag} {value!r} is not an ISO 8601 date or time (e.g. 2026-11-01 or 2026-11-01T09:00Z)",
                       EXIT_USAGE) from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


async def search_sessions(args) -> int:
    from agentmesh.v1 import learning_pb2

    settings = load_settings()
    request = learning_pb2.SearchConversationsRequest(
        namespace=args.namespace, query=args.query, k=args.k, session_id=args.session,
        since=_iso(args.since, "--since"), until=_iso(args.until, "--until"), role=args.role, tool=args.tool)
    async with channel_to(settings, "gateway") as channel:
        try:
            reply = await GatewayClient(channel).stub.SearchConversations(
                request, metadata=call_metadata(settings), timeout=30)
        except grpc.aio.AioRpcError as err:
            raise rpc_failure(err, "gateway", settings) from None
    if args.json:
        print_json([to_dict(h) for h in reply.hits])
        return EXIT_OK
    if not reply.hits:
        print("nothing in the namespace's conversations matched")
    for h in reply.hits:
        print(f"{h.session_id} #{h.seq}  {h.role}  {_when(h.created_at)}  (score {h.score:.2f})")
        if h.HasField("before"):
            print(f"    before: {h.before.role}: {' '.join(h.before.content.split())[:200]}")
        print(f"    {h.text}")
        if h.HasField("after"):
            print(f"    after: {h.after.role}: {' '.join(h.after.content.split())[:200]}")
    return EXIT_OK
