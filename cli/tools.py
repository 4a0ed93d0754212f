"""`agentmesh tools list|run`: the tool catalog, and one sandboxed call by hand."""

from __future__ import annotations

import json

import grpc

from agentmesh.cli.common import (
    EXIT_OK,
    EXIT_SERVER_ERROR,
    call_metadata,
    channel_to,
    load_settings,
    parse_json_object,
    print_json,
    rpc_failure,
    to_dict,
)
from agentmesh.ids import new_id
from agentmesh.v1 import tools_pb2, tools_pb2_grpc


def register(subparsers) -> None:
    tools = subparsers.add_parser("tools", help="list tools or run one in the sandbox")
    verbs = tools.add_subparsers(dest="verb", required=True)
    listing = verbs.add_parser("list", help="the tools the agent can call, with their arguments")
    listing.add_argument("--json", action="store_true")
    listing.add_argument("--namespace", default="", help="also that namespace's own MCP servers' tools (agentmesh mcp)")
    listing.set_defaults(func=list_tools)
    run = verbs.add_parser("run", help="run one tool call, e.g. tools run shell '{\"command\": \"ls\"}'")
    run.add_argument("name")
    run.add_argument("arguments", metavar="ARGS_JSON")
    run.add_argument("--session", default="cli", help="whose workspace to run in (default: cli)")
    run.add_argument("--json", action="store_true", help="print the structured result")
    run.add_argument("--namespace", default="", help="whose own MCP servers' tools may be run (agentmesh mcp)")
    run.set_defaults(func=run_tool)


async def list_tools(args) -> int:
    settings = load_settings()
    async with channel_to(settings, "tools") as channel:
        try:
            reply = await tools_pb2_grpc.ToolsStub(channel).ListTools(
                tools_pb2.ListToolsRequest(namespace=args.namespace), metadata=call_metadata(settings), timeout=30
            )
        except grpc.aio.AioRpcError as err:
            raise rpc_failure(err, "tools", settings) from None
    if args.json:
        print_json([{**to_dict(t), "parameters": json.loads(t.parameters_json_schema or "{}")} for t in reply.tools])
        return EXIT_OK
    for tool in reply.tools:
        params = json.loads(tool.parameters_json_schema or "{}").get("properties", {})
        print(f"{tool.name:<12} {tool.description.splitlines()[0] if tool.description else ''}")
        if params:
            print(f"{'':<12} args: {', '.join(params)}")
    return EXIT_OK


async def run_tool(args) -> int:
    settings = load_settings()
    arguments = parse_json_object(args.arguments, "ARGS_JSON")
    request = tools_pb2.ExecuteRequest(
        session_id=args.session, call_id=new_id("cli"), name=args.name, arguments_json=json.dumps(arguments),
        namespace=args.namespace,
    )
    async with channel_to(settings, "tools") as channel:
        try:
            reply = await tools_pb2_grpc.ToolsStub(channel).Execute(request, metadata=call_metadata(settings), timeout=600)
        except grpc.aio.AioRpcError as err:
            raise rpc_failure(err, "tools", settings) from None
    result = reply.result
    if args.json:
        print_json(to_dict(result))
    else:
        print(result.output)
    return EXIT_SERVER_ERROR if result.is_error else EXIT_OK
