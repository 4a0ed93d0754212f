"""`agentmesh memory blocks list|show|set|revert|approve|reject|policy`: a namespace's memory blocks
(docs/memory.md, "Memory blocks") through the gateway. gRPC and the stubs are imported when a
command runs, never for its help."""

from __future__ import annotations

import time
from typing import Any

from agentmesh.cli.common import EXIT_OK, gateway_call, print_json, to_dict


def register(verbs) -> None:
    blocks = verbs.add_parser("blocks", help="the memory blocks the agent keeps: list, show, revert, approve, reject")
    actions = blocks.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="the blocks, the edits waiting for a person, and the edit policy")
    listing.add_argument("--namespace", default="default")
    listing.add_argument("--all-users", action="store_true",
                         help="every person's user block too (an admin's; written to the audit log)")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=list_blocks)
    whose = "another person's user block (their subject, e.g. user:3f9a…; an admin's, audited); default: yours"
    show = actions.add_parser("show", help="one block with every version and where each came from")
    show.add_argument("name")
    show.add_argument("--namespace", default="default")
    show.add_argument("--user", default="", help=whose)
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=show_block)
    put = actions.add_parser("set", help="write a block's whole text (a new version, applied at once)")
    put.add_argument("name")
    put.add_argument("text", help="the block's new text; - reads it from stdin")
    put.add_argument("--namespace", default="default")
    put.add_argument("--user", default="", help=whose)
    put.set_defaults(func=set_block)
    revert = actions.add_parser("revert", help="restore a version (as a new version)")
    revert.add_argument("name")
    revert.add_argument("version", type=int)
    revert.add_argument("--namespace", default="default")
    revert.add_argument("--user", default="", help=whose)
    revert.set_defaults(func=revert_block)
    for verb, what in (("approve", "apply an edit the agent proposed"), ("reject", "drop an edit the agent proposed")):
        decide = actions.add_parser(verb, help=what)
        decide.add_argument("draft_id")
        decide.add_argument("--namespace", default="default")
        decide.add_argument("--user", default="", help="a draft of another person's user block (their subject; "
                            "an admin's, audited)")
        decide.set_defaults(func=approve_edit if verb == "approve" else reject_edit)
    policy = actions.add_parser("policy", help="whether the agent's edits apply at once or wait for a person")
    policy.add_argument("edits", choices=("apply", "draft"))
    policy.add_argument("--namespace", default="default")
    policy.set_defaults(func=set_policy)


async def _gateway(method: str, request: Any) -> Any:
    return await gateway_call(method, request)


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts)) if ts else "-"


def _from(p: Any) -> str:
    where = f"session {p.session_id} #{p.seq}" if p.session_id else ""
    return ", ".join(part for part in (p.by, where, p.model) if part)


async def list_blocks(args) -> int:
    from agentmesh.v1 import learning_pb2

    reply = await _gateway("ListBlocks", learning_pb2.ListBlocksRequest(namespace=args.namespace,
                                                                        all_users=args.all_users))
    if args.json:
        print_json(to_dict(reply))
        return EXIT_OK
    if not reply.blocks:
        print(f"no memory blocks in {args.namespace!r} yet: the agent writes them with block_append")
    for b in reply.blocks:
        of = f"  of {b.user}" if b.user and args.all_users else ""
        print(f"{b.name}{of}  v{b.version}  {len(b.text)}/{b.max_chars} chars  {_when(b.updated_at)}")
        for line in b.text.splitlines():
            print(f"  {line}")
    print(f"edits: {reply.edits}   {len(reply.drafts)} waiting")
    for d in reply.drafts:
        of = f" of {d.user}" if d.user and args.all_users else ""
        print(f"  {d.id}  {d.name}{of}  {d.change}  {d.text!r}{f' for {d.old!r}' if d.old else ''}  ({_from(d.provenance)})")
    return EXIT_OK


async def show_block(args) -> int:
    from agentmesh.v1 import learning_pb2

    block = await _gateway("GetBlock", learning_pb2.GetBlockRequest(namespace=args.namespace, name=args.name,
                                                                    user=args.user))
    if args.json:
        print_json(to_dict(block))
        return EXIT_OK
    print(f"{block.name}  v{block.version}  {len(block.text)}/{block.max_chars} chars")
    for line in block.text.splitlines():
        print(f"  {line}")
    for v in block.versions:
        change = f"revert to v{v.reverted_to}" if v.change == "revert" else v.change or "restored"
        print(f"v{v.version}  {_when(v.created_at)}  {change}  ({_from(v.provenance)})")
    for d in block.drafts:
        print(f"draft {d.id}  {d.change}  {d.text!r}  ({_from(d.provenance)})")
    return EXIT_OK


async def revert_block(args) -> int:
    from agentmesh.v1 import learning_pb2

    block = await _gateway("RevertBlock", learning_pb2.RevertBlockRequest(
        namespace=args.namespace, name=args.name, version=args.version, user=args.user))
    print(f"{block.name} is now v{block.version} (the text of v{args.version})")
    return EXIT_OK


async def set_block(args) -> int:
    import sys

    from agentmesh.v1 import learning_pb2

    text = sys.stdin.read() if args.text == "-" else args.text
    block = await _gateway("SetBlock", learning_pb2.SetBlockRequest(
        namespace=args.namespace, name=args.name, text=text, user=args.user))
    print(f"{block.name} is now v{block.version} ({len(block.text)}/{block.max_chars} chars)")
    return EXIT_OK


async def approve_edit(args) -> int:
    from agentmesh.v1 import learning_pb2

    block = await _gateway("ApproveBlockEdit", learning_pb2.BlockEditRef(namespace=args.namespace, draft_id=args.draft_id,
                                                                    user=args.user))
    print(f"approved: {block.name} is now v{block.version}")
    return EXIT_OK


async def reject_edit(args) -> int:
    from agentmesh.v1 import learning_pb2

    block = await _gateway("RejectBlockEdit", learning_pb2.BlockEditRef(namespace=args.namespace, draft_id=args.draft_id,
                                                                   user=args.user))
    print(f"rejected: {block.name} stays v{block.version}")
    return EXIT_OK


async def set_policy(args) -> int:
    from agentmesh.v1 import learning_pb2

    reply = await _gateway("SetBlockPolicy", learning_pb2.BlockPolicy(namespace=args.namespace, edits=args.edits))
    print(f"{reply.namespace}: block edits {'apply at once' if reply.edits == 'apply' else 'wait for a person'}")
    return EXIT_OK
