"""`agentmesh tools list|run|allow|deny|policy`: the tool catalog, one sandboxed call by hand, and a
namespace's tool policy."""

from __future__ import annotations

import json
import sys

import grpc

from agentmesh.cli.common import (
    EXIT_OK,
    EXIT_SERVER_ERROR,
    call_metadata,
    channel_to,
    gateway_call,
    load_settings,
    parse_json_object,
    print_json,
    rpc_failure,
    service_call,
    to_dict,
)
from agentmesh.clients.gateway import GatewayClient
from agentmesh.clients.tools import ToolsClient
from agentmesh.ids import new_id
from agentmesh.internal.v1 import tools_service_pb2
from agentmesh.v1 import common_pb2, sessions_pb2, tools_pb2


def register(subparsers) -> None:
    tools = subparsers.add_parser("tools", help="list tools or run one in the sandbox")
    verbs = tools.add_subparsers(dest="verb", required=True)
    listing = verbs.add_parser("list", help="the tools the agent can call, with their arguments")
    listing.add_argument("--json", action="store_true")
    scope = listing.add_mutually_exclusive_group()
    scope.add_argument("--session", help="as the tool policies leave them for this session (through the gateway)")
    scope.add_argument("--namespace", help="as the tool policies leave them for this namespace (through the gateway)")
    listing.set_defaults(func=list_tools)
    for verb, help_text in (("allow", "let a namespace's sessions use only these tools (adds to its allow list)"),
                            ("deny", "turn these tools off for a namespace's sessions (adds to its deny list)")):
        parser = verbs.add_parser(verb, help=help_text)
        parser.add_argument("namespace")
        parser.add_argument("names", nargs="+", metavar="TOOL", help="tool names or patterns such as 'docs__*'")
        parser.add_argument("--json", action="store_true")
        parser.set_defaults(func=change_namespace_policy, list_name=verb)
    policy = verbs.add_parser("policy", help="a namespace's tool policy (and the deployment's)")
    policy.add_argument("namespace")
    policy.add_argument("--clear", action="store_true", help="remove the namespace's policy: every tool the deployment allows")
    policy.add_argument("--json", action="store_true")
    policy.set_defaults(func=show_namespace_policy)
    run = verbs.add_parser("run", help="run one tool call, e.g. tools run shell '{\"command\": \"ls\"}'")
    run.add_argument("name")
    run.add_argument("arguments", metavar="ARGS_JSON")
    run.add_argument("--session", default="cli", help="whose workspace to run in (default: cli)")
    run.add_argument("--json", action="store_true", help="print the structured result")
    run.add_argument("--namespace", default="", help="whose own MCP servers' tools may be run (agentmesh mcp)")
    run.set_defaults(func=run_tool)


async def list_tools(args) -> int:
    settings = load_settings()
    scoped = bool(args.session or args.namespace)
    service = "gateway" if scoped else "tools"
    async with channel_to(settings, service) as channel:
        stub = GatewayClient(channel).stub if scoped else ToolsClient(channel).stub
        try:
            reply = await stub.ListTools(
                tools_pb2.ListToolsRequest(session_id=args.session or "", namespace=args.namespace or ""),
                metadata=call_metadata(settings), timeout=30,
            )
        except grpc.aio.AioRpcError as err:
            raise rpc_failure(err, service, settings) from None
    # A server that cannot start is said on stderr (the JSON listing stays the tools alone).
    for down in reply.unavailable_mcp_servers:
        print(f"MCP server {down.server.name!r} is unavailable, its tools are missing: {down.error}", file=sys.stderr)
    if args.json:
        print_json([{**to_dict(t), "parameters": json.loads(t.parameters_json_schema or "{}")} for t in reply.tools])
        return EXIT_OK
    for tool in reply.tools:
        params = json.loads(tool.parameters_json_schema or "{}").get("properties", {})
        marks = "".join(f" [{m}]" for m, on in (("read-only", tool.read_only), ("runs code", tool.runs_code)) if on)
        print(f"{tool.name:<12} {tool.description.splitlines()[0] if tool.description else ''}{marks}")
        if params:
            print(f"{'':<12} args: {', '.join(params)}")
    return EXIT_OK


async def run_tool(args) -> int:
    settings = load_settings()
    arguments = parse_json_object(args.arguments, "ARGS_JSON")
    request = tools_service_pb2.ExecuteRequest(
        session_id=args.session, call_id=new_id("cli"), name=args.name, arguments_json=json.dumps(arguments),
        namespace=args.namespace,
    )
    reply = await service_call("tools", "Execute", request, settings=settings, timeout=600)
    result = reply.result
    if args.json:
        print_json(to_dict(result))
    else:
        print(result.output)
    return EXIT_SERVER_ERROR if result.is_error else EXIT_OK


async def _namespace_call(settings, method: str, request) -> sessions_pb2.NamespaceSettings:
    return await gateway_call(method, request, settings=settings)


def _print_policy(settings: sessions_pb2.NamespaceSettings, as_json: bool) -> None:
    if as_json:
        print_json({"namespace": settings.namespace, "allow": list(settings.tools.allow),
                    "deny": list(settings.tools.deny), "updated_at": settings.updated_at})
        return
    allow = ", ".join(settings.tools.allow) if settings.tools.allow else "every tool the deployment allows"
    print(f"namespace {settings.namespace}: allows {allow}")
    if settings.tools.deny:
        print(f"namespace {settings.namespace}: denies {', '.join(settings.tools.deny)}")


async def change_namespace_policy(args) -> int:
    """Add names to the namespace's allow or deny list (read, change, replace)."""
    settings = load_settings()
    current = await _namespace_call(settings, "GetNamespaceSettings",
                                    sessions_pb2.GetNamespaceSettingsRequest(namespace=args.namespace))
    allow, deny = list(current.tools.allow), list(current.tools.deny)
    target = allow if args.list_name == "allow" else deny
    target.extend(name for name in args.names if name not in target)
    updated = await _namespace_call(settings, "UpdateNamespaceSettings", sessions_pb2.UpdateNamespaceSettingsRequest(
        namespace=args.namespace, tools=common_pb2.ToolPolicy(allow=allow, deny=deny)))
    _print_policy(updated, args.json)
    return EXIT_OK


async def show_namespace_policy(args) -> int:
    settings = load_settings()
    if args.clear:
        shown = await _namespace_call(settings, "UpdateNamespaceSettings",
                                      sessions_pb2.UpdateNamespaceSettingsRequest(namespace=args.namespace))
    else:
        shown = await _namespace_call(settings, "GetNamespaceSettings",
                                      sessions_pb2.GetNamespaceSettingsRequest(namespace=args.namespace))
    _print_policy(shown, args.json)
    return EXIT_OK
