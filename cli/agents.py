"""`agentmesh agents create|list|show|edit|versions|rollback|delete`: a namespace's named agents
(docs/agents.md), each defined by a YAML file of the shape a Kubernetes `Agent` resource has:

    apiVersion: agentmesh.dev/v1alpha1
    kind: Agent
    metadata: {name: reviewer, namespace: team-a}
    spec:
      description: Reviews a change and reports problems.
      instructions: You are a meticulous reviewer...
      model: default
      modelParameters: {temperature: 0.2, topP: 0.9}
      tools: {allow: [read_file, grep], deny: [], permissionMode: normal, approvals: [shell]}
      skills: [review-checklist]
      mcpServers: [docs]
      subAgents: [explore]
      budgets: {steps: 20, tokens: 200000}

The file is read and its shape checked here (a usage error names what is wrong); the memory service
bounds every field again and answers INVALID_ARGUMENT with the field at fault.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import yaml  # type: ignore[import-untyped]  # PyYAML ships no type hints

from agentmesh.agent_manifest import ManifestError, document_of, spec_from_document
from agentmesh.cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    gateway_call,
    print_json,
    to_dict,
)
from agentmesh.v1 import agents_pb2


def register(subparsers) -> None:
    agents = subparsers.add_parser("agents", help="define, list, version and roll back a namespace's named agents")
    verbs = agents.add_subparsers(dest="verb", required=True)

    create = verbs.add_parser("create", help="define a new agent from a YAML file (kind: Agent)")
    create.add_argument("-f", "--file", type=Path, required=True)
    create.add_argument("--namespace", default="", help="default: the file's metadata.namespace, else 'default'")
    create.set_defaults(func=create_agent)

    edit = verbs.add_parser("edit", help="replace an agent's definition from a YAML file: a new version")
    edit.add_argument("-f", "--file", type=Path, required=True)
    edit.add_argument("--namespace", default="")
    edit.set_defaults(func=edit_agent)

    listing = verbs.add_parser("list", help="the namespace's agents (the built-ins explore, code, plan too)")
    listing.add_argument("--namespace", default="default")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=list_agents)

    show = verbs.add_parser("show", help="an agent's definition as YAML (NAME or NAME@VERSION)")
    show.add_argument("name")
    show.add_argument("--namespace", default="default")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=show_agent)

    versions = verbs.add_parser("versions", help="every version of an agent, oldest first")
    versions.add_argument("name")
    versions.add_argument("--namespace", default="default")
    versions.add_argument("--json", action="store_true")
    versions.set_defaults(func=agent_versions)

    rollback = verbs.add_parser("rollback", help="point the name at an older version (as a new version equal to it)")
    rollback.add_argument("name")
    rollback.add_argument("version", type=int)
    rollback.add_argument("--namespace", default="default")
    rollback.set_defaults(func=rollback_agent)

    delete = verbs.add_parser("delete", help="remove an agent and every version of it")
    delete.add_argument("name")
    delete.add_argument("--namespace", default="default")
    delete.set_defaults(func=delete_agent)


async def _call(method_name: str, request):
    return await gateway_call(method_name, request)


def _read(path: Path, namespace: str) -> tuple[str, agents_pb2.AgentSpec]:
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CliError(f"{path}: cannot read it ({exc.strerror or exc})", EXIT_USAGE) from None
    except yaml.YAMLError as exc:
        raise CliError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})", EXIT_USAGE) from None
    try:
        file_namespace, spec = spec_from_document(document)
    except ManifestError as exc:
        raise CliError(f"{path}: {exc}", EXIT_USAGE) from None
    return namespace or file_namespace or "default", spec


def _line(info: agents_pb2.AgentInfo) -> str:
    if info.builtin:
        return f"{info.spec.name} (built-in)  {info.spec.description}"
    when = dt.datetime.fromtimestamp(info.created_at, dt.UTC).strftime("%Y-%m-%d %H:%M")
    note = f", a copy of v{info.rolled_back_from}" if info.rolled_back_from else ""
    current = " *" if info.version == info.current_version else ""
    return f"{info.spec.name} v{info.version}{current}  {info.spec.description}  ({when}{note})"


async def create_agent(args) -> int:
    namespace, spec = _read(args.file, args.namespace)
    info = await _call("CreateAgent", agents_pb2.CreateAgentRequest(namespace=namespace, spec=spec))
    print(f"created {_line(info)}")
    return EXIT_OK


async def edit_agent(args) -> int:
    namespace, spec = _read(args.file, args.namespace)
    info = await _call("UpdateAgent", agents_pb2.UpdateAgentRequest(namespace=namespace, spec=spec))
    print(f"updated {_line(info)}")
    return EXIT_OK


async def list_agents(args) -> int:
    reply = await _call("ListAgents", agents_pb2.ListAgentsRequest(namespace=args.namespace))
    if args.json:
        print_json([to_dict(a) for a in reply.agents])
    else:
        for info in reply.agents:
            print(_line(info))
    return EXIT_OK


async def show_agent(args) -> int:
    info = await _call("GetAgent", agents_pb2.GetAgentRequest(namespace=args.namespace, name=args.name))
    if args.json:
        print_json(to_dict(info))
    else:
        print(f"# version {info.version} of {info.current_version}" if not info.builtin else "# built-in")
        print(yaml.safe_dump(document_of(info), sort_keys=False, allow_unicode=True), end="")
    return EXIT_OK


async def agent_versions(args) -> int:
    reply = await _call("ListAgentVersions", agents_pb2.ListAgentVersionsRequest(namespace=args.namespace,
                                                                                 name=args.name))
    if args.json:
        print_json([to_dict(v) for v in reply.versions])
    else:
        for info in reply.versions:
            print(_line(info))
    return EXIT_OK


async def rollback_agent(args) -> int:
    info = await _call("RollbackAgent", agents_pb2.RollbackAgentRequest(namespace=args.namespace, name=args.name,
                                                                        version=args.version))
    print(f"rolled back: {_line(info)}")
    return EXIT_OK


async def delete_agent(args) -> int:
    reply = await _call("DeleteAgent", agents_pb2.DeleteAgentRequest(namespace=args.namespace, name=args.name))
    print(f"deleted {args.name} ({reply.removed_versions} version{'s' if reply.removed_versions != 1 else ''})")
    return EXIT_OK
