"""`agentmesh mcp add|list|remove`: a namespace's own MCP servers, through the gateway.

    agentmesh mcp add time --command /usr/bin/python3 --arg -m --arg mcp_server_time
    agentmesh mcp add docs --url https://mcp.example.com/mcp --header-secret Authorization=DOCS_TOKEN
    agentmesh mcp add search --command /usr/bin/mcp-search --env-secret API_KEY=SEARCH_KEY --namespace team-a
    agentmesh mcp list [--namespace team-a] [--json]
    agentmesh mcp remove docs
"""

from __future__ import annotations

from google.protobuf.json_format import MessageToDict

from agentmesh.cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    gateway_call,
    print_json,
)
from agentmesh.v1 import tools_pb2

# Adding starts the server and lists its tools before answering.
ADD_TIMEOUT_S = 90.0


def register(subparsers) -> None:
    mcp = subparsers.add_parser("mcp", help="a namespace's own MCP servers: add, list, remove")
    commands = mcp.add_subparsers(dest="mcp_command", required=True)

    add = commands.add_parser("add", help="add an MCP server (checked: it must start and list usable tools)")
    add.add_argument("name", help="1-32 letters, digits or '-'; its tools are NAME__<tool>")
    source = add.add_mutually_exclusive_group(required=True)
    source.add_argument("--command", help="a stdio server: the program (run in the sandbox — the jail, or a pod of the sandbox image in a cluster — with no network)")
    source.add_argument("--url", help="a streamable-HTTP server's URL (reached through the egress policy)")
    add.add_argument("--arg", action="append", default=[], dest="args", help="an argument of --command (repeat)")
    add.add_argument("--header", action="append", default=[], dest="headers", metavar="K=V",
                     help="an HTTP header for --url (repeat); stored as given, so put secrets in --header-secret")
    add.add_argument("--header-secret", action="append", default=[], dest="header_secrets", metavar="HEADER=SECRET",
                     help="an HTTP header for --url whose value is the namespace's secret SECRET (repeat)")
    add.add_argument("--env-secret", action="append", default=[], dest="env_secrets", metavar="VAR=SECRET",
                     help="an environment variable of --command whose value is the namespace's secret SECRET (repeat)")
    add.add_argument("--namespace", default="default")
    add.add_argument("--json", action="store_true")
    add.set_defaults(func=add_server)

    listing = commands.add_parser("list", help="the namespace's MCP servers and their tools")
    listing.add_argument("--namespace", default="default")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=list_servers)

    remove = commands.add_parser("remove", help="remove an MCP server (its tools leave the catalog)")
    remove.add_argument("name")
    remove.add_argument("--namespace", default="default")
    remove.set_defaults(func=remove_server)


def _pairs(pairs: list[str], option: str = "--header") -> dict[str, str]:
    found = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key or (option != "--header" and not value):
            raise CliError(f"{option} takes {'K=V' if option == '--header' else 'NAME=SECRET'}, got {pair!r}", EXIT_USAGE)
        found[key] = value
    return found


async def _call(method: str, request, timeout: float = 30.0):
    return await gateway_call(method, request, timeout=timeout)


def _describe(status: tools_pb2.McpServerStatus) -> str:
    server = status.server
    where = server.url or " ".join([server.command, *server.args])
    state = "available" if status.available else f"unavailable: {status.error}"
    tools = ", ".join(status.tools) or "no tools"
    secrets = ", ".join(f"{key} from secret {name}" for key, name in {**server.env_secrets, **server.header_secrets}.items())
    return f"{server.name}  {where}\n  {state}; {tools}" + (f"\n  {secrets}" if secrets else "")


async def add_server(args) -> int:
    if args.args and not args.command:
        raise CliError("--arg goes with --command", EXIT_USAGE)
    if (args.headers or args.header_secrets) and not args.url:
        raise CliError("--header and --header-secret go with --url", EXIT_USAGE)
    if args.env_secrets and not args.command:
        raise CliError("--env-secret goes with --command", EXIT_USAGE)
    spec = tools_pb2.McpServerSpec(name=args.name, command=args.command or "", args=args.args, url=args.url or "",
                                   headers=_pairs(args.headers), header_secrets=_pairs(args.header_secrets, "--header-secret"),
                                   env_secrets=_pairs(args.env_secrets, "--env-secret"))
    status = await _call("AddMcpServer", tools_pb2.AddMcpServerRequest(namespace=args.namespace, server=spec),
                         timeout=ADD_TIMEOUT_S)
    if args.json:
        print_json(MessageToDict(status, preserving_proto_field_name=True))
    else:
        print(f"added to namespace {args.namespace}: {_describe(status)}")
    return EXIT_OK


async def list_servers(args) -> int:
    reply = await _call("ListMcpServers", tools_pb2.ListMcpServersRequest(namespace=args.namespace), timeout=ADD_TIMEOUT_S)
    if args.json:
        print_json([MessageToDict(s, preserving_proto_field_name=True) for s in reply.servers])
        return EXIT_OK
    if not reply.servers:
        print(f"namespace {args.namespace} has no MCP servers of its own (add one with `agentmesh mcp add`)")
    for status in reply.servers:
        print(_describe(status))
    return EXIT_OK


async def remove_server(args) -> int:
    await _call("RemoveMcpServer", tools_pb2.RemoveMcpServerRequest(namespace=args.namespace, name=args.name))
    print(f"removed {args.name} from namespace {args.namespace}")
    return EXIT_OK
