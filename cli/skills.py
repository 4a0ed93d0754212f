"""`agentmesh skills add|list|show|remove|approve|auto-accept`: a namespace's SKILL.md skills."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from agentmesh.cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    gateway_call,
    print_json,
    to_dict,
)
from agentmesh.v1 import learning_pb2

FOLDERS = ("scripts", "references")


def register(subparsers) -> None:
    skills = subparsers.add_parser("skills", help="add, list, show or remove a namespace's skills (SKILL.md folders)")
    verbs = skills.add_subparsers(dest="verb", required=True)

    add = verbs.add_parser("add", help="store a skill folder (SKILL.md, scripts/, references/) as a new version")
    add.add_argument("dir", type=Path)
    add.add_argument("--namespace", default="default")
    add.add_argument("--draft", action="store_true", help="store it as a draft awaiting approval")
    add.set_defaults(func=add_skill)

    listing = verbs.add_parser("list", help="the namespace's skills (latest active version of each)")
    listing.add_argument("--namespace", default="default")
    listing.add_argument("--drafts", action="store_true", help="include drafts awaiting approval")
    listing.add_argument("--tools", action="store_true", help="list the namespace's promoted tools instead")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=list_skills)

    show = verbs.add_parser("show", help="a skill's SKILL.md body and files")
    show.add_argument("name")
    show.add_argument("--namespace", default="default")
    show.add_argument("--version", type=int, default=0)
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=show_skill)

    remove = verbs.add_parser("remove", help="remove every version of a skill (or of a promoted tool)")
    remove.add_argument("name")
    remove.add_argument("--tool", action="store_true", help="NAME is a promoted tool")
    remove.add_argument("--namespace", default="default")
    remove.set_defaults(func=remove_skill)

    approve = verbs.add_parser("approve", help="make a skill's latest draft its active version")
    approve.add_argument("name")
    approve.add_argument("--namespace", default="default")
    approve.set_defaults(func=approve_skill)

    auto = verbs.add_parser("auto-accept", help="whether drafts become active without approval")
    auto.add_argument("state", choices=("on", "off"))
    auto.add_argument("--namespace", default="default")
    auto.set_defaults(func=set_auto_accept)


async def _call(method_name: str, request):
    """The gateway's RPC of that name (it passes skills calls to the memory service)."""
    return await gateway_call(method_name, request)


def read_skill_dir(root: Path) -> list[learning_pb2.SkillFile]:
    """SKILL.md and every file under scripts/ and references/ (UTF-8 text)."""
    if not (root / "SKILL.md").is_file():
        raise CliError(f"{root} is not a skill folder: it has no SKILL.md", EXIT_USAGE)
    paths = [root / "SKILL.md"]
    for folder in FOLDERS:
        if (root / folder).is_dir():
            paths += sorted(p for p in (root / folder).rglob("*") if p.is_file())
    files = []
    for path in paths:
        try:
            content = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise CliError(f"{path} is not UTF-8 text; skills hold text files only", EXIT_USAGE) from None
        files.append(learning_pb2.SkillFile(path=path.relative_to(root).as_posix(), content=content))
    return files


def _line(info: learning_pb2.SkillInfo) -> str:
    when = dt.datetime.fromtimestamp(info.created_at, dt.UTC).strftime("%Y-%m-%d %H:%M")
    draft = " [draft]" if info.status == "draft" else ""
    return f"{info.name} v{info.version}{draft}  {info.description}  ({when}, {len(info.paths)} files)"


async def add_skill(args) -> int:
    files = read_skill_dir(args.dir)
    info = await _call("PutSkill", learning_pb2.PutSkillRequest(namespace=args.namespace, files=files,
                                                              draft=args.draft, source="cli"))
    print(f"stored {_line(info)}")
    return EXIT_OK


async def list_tools(args) -> int:
    reply = await _call("ListPromotedTools", learning_pb2.ListPromotedToolsRequest(namespace=args.namespace))
    if args.json:
        print_json([{**to_dict(t), "parameters": json.loads(t.parameters_json)} for t in reply.tools])
    elif not reply.tools:
        print("no promoted tools")
    else:
        for t in reply.tools:
            when = dt.datetime.fromtimestamp(t.created_at, dt.UTC).strftime("%Y-%m-%d %H:%M")
            params = ", ".join(json.loads(t.parameters_json).get("properties", {}))
            summary = t.description.splitlines()[0]
            print(f"{t.name}({params}) v{t.version}  {summary}  ({when}, from {t.origin})")
    return EXIT_OK


async def list_skills(args) -> int:
    if args.tools:
        return await list_tools(args)
    reply = await _call("ListSkills", learning_pb2.ListSkillsRequest(namespace=args.namespace, include_drafts=args.drafts))
    if args.json:
        print_json([to_dict(s) for s in reply.skills])
    elif not reply.skills:
        print("no skills")
    else:
        for info in reply.skills:
            print(_line(info))
    return EXIT_OK


async def show_skill(args) -> int:
    skill = await _call("GetSkill", learning_pb2.GetSkillRequest(namespace=args.namespace, name=args.name,
                                                               version=args.version))
    if args.json:
        print_json(to_dict(skill))
        return EXIT_OK
    print(_line(skill.info))
    print()
    print(skill.body)
    others = [f.path for f in skill.files if f.path != "SKILL.md"]
    if others:
        print()
        print("files: " + ", ".join(others))
    return EXIT_OK


async def remove_skill(args) -> int:
    if args.tool:
        reply = await _call("RemovePromotedTool", learning_pb2.SkillName(namespace=args.namespace, name=args.name))
        print(f"removed the tool {args.name} ({reply.removed_versions} versions)")
        return EXIT_OK
    reply = await _call("RemoveSkill", learning_pb2.SkillName(namespace=args.namespace, name=args.name))
    print(f"removed {args.name} ({reply.removed_versions} versions)")
    return EXIT_OK


async def approve_skill(args) -> int:
    info = await _call("ApproveSkill", learning_pb2.SkillName(namespace=args.namespace, name=args.name))
    print(f"approved {_line(info)}")
    return EXIT_OK


async def set_auto_accept(args) -> int:
    policy = await _call("SetSkillPolicy", learning_pb2.SkillPolicy(namespace=args.namespace, auto_accept=args.state == "on"))
    print(f"namespace {policy.namespace}: drafts are {'accepted at once' if policy.auto_accept else 'held for approval'}")
    return EXIT_OK
