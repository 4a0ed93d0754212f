"""`agentmesh profile set|show|clear`: a namespace's standing instructions (soul, user, project),
through the gateway."""

from __future__ import annotations

from pathlib import Path

from agentmesh.cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    gateway_call,
    print_json,
)
from agentmesh.v1 import learning_pb2

PARTS = ("soul", "user", "project")


def register(subparsers) -> None:
    profile = subparsers.add_parser("profile", help="standing instructions: a namespace's soul, user and project texts")
    verbs = profile.add_subparsers(dest="verb", required=True)

    put = verbs.add_parser("set", help="set one part from a markdown file ('-' reads stdin)")
    put.add_argument("part", choices=PARTS)
    put.add_argument("file")
    put.add_argument("--namespace", default="default")
    put.set_defaults(func=set_part)

    show = verbs.add_parser("show", help="print the namespace's parts, in the order the prompt has them")
    show.add_argument("--namespace", default="default")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=show_profile)

    clear = verbs.add_parser("clear", help="remove one part")
    clear.add_argument("part", choices=PARTS)
    clear.add_argument("--namespace", default="default")
    clear.set_defaults(func=clear_part)


async def _call(method_name: str, request) -> learning_pb2.Profile:
    return await gateway_call(method_name, request)


def _read(file: str) -> str:
    if file == "-":
        import sys

        return sys.stdin.read()
    path = Path(file)
    if not path.is_file():
        raise CliError(f"no such file: {path}", EXIT_USAGE)
    return path.read_text(encoding="utf-8")


async def set_part(args) -> int:
    text = _read(args.file)
    if not text.strip():
        raise CliError(f"{args.file} is empty; use `agentmesh profile clear {args.part}` to remove the part", EXIT_USAGE)
    profile = await _call("SetProfile", learning_pb2.SetProfileRequest(namespace=args.namespace, part=args.part, text=text))
    print(f"{args.part} set for namespace {profile.namespace} ({len(getattr(profile, args.part))} characters)")
    return EXIT_OK


async def clear_part(args) -> int:
    profile = await _call("SetProfile", learning_pb2.SetProfileRequest(namespace=args.namespace, part=args.part, text=""))
    print(f"{args.part} cleared for namespace {profile.namespace}")
    return EXIT_OK


async def show_profile(args) -> int:
    profile = await _call("GetProfile", learning_pb2.GetProfileRequest(namespace=args.namespace))
    if args.json:
        print_json({"namespace": profile.namespace, **{p: getattr(profile, p) for p in PARTS},
                    "updated_at": profile.updated_at, "max_chars": profile.max_chars})
        return EXIT_OK
    for part in PARTS:
        text = getattr(profile, part)
        print(f"## {part}")
        print(text if text else "(not set)")
        print()
    return EXIT_OK
