"""`agentmesh memory add|search|import|forget|erase|migrate`: long-term memory by hand; `agentmesh
memory blocks …` (the memory blocks the agent keeps) is memory_blocks.py."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
from google.protobuf import json_format, struct_pb2

from agentmesh.cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    call_metadata,
    channel_to,
    load_settings,
    print_json,
    rpc_failure,
)
from agentmesh.clients.memory import MemoryClient
from agentmesh.internal.v1 import memory_service_pb2

IMPORT_BATCH = 256


def register(subparsers) -> None:
    memory = subparsers.add_parser("memory", help="add, search, import or forget long-term memories; the memory blocks")
    verbs = memory.add_subparsers(dest="verb", required=True)

    add = verbs.add_parser("add", help="remember a text (the same text twice updates it)")
    add.add_argument("text")
    add.add_argument("--namespace", default="default")
    add.add_argument("--kind", default="fact")
    add.add_argument("--metadata", default="", help="a JSON object of extra fields")
    add.set_defaults(func=add_memory)

    search = verbs.add_parser("search", help="find memories by meaning and keywords")
    search.add_argument("query")
    search.add_argument("--namespace", default="default")
    search.add_argument("--k", type=int, default=5)
    search.add_argument("--kind", action="append", default=[], help="only these kinds (repeatable)")
    search.add_argument("--json", action="store_true")
    search.set_defaults(func=search_memory)

    imp = verbs.add_parser("import", help="bulk import a JSONL file: text, optional id, kind, metadata, created_at")
    imp.add_argument("file", type=Path)
    imp.add_argument("--namespace", default="default")
    imp.set_defaults(func=import_memories)

    forget = verbs.add_parser("forget", help="forget memories by id, by kind, or all of a namespace")
    forget.add_argument("ids", nargs="*")
    forget.add_argument("--namespace", default="default")
    forget.add_argument("--kind", action="append", default=[])
    forget.add_argument("--all", action="store_true", help="forget every memory of the namespace")
    forget.set_defaults(func=forget_memories)

    erase = verbs.add_parser("erase", help="remove what a person left in a namespace: their sessions (transcripts, "
                             "workspaces), the memories they made, their usage (admin; audited; for good)")
    erase.add_argument("--user", required=True, help="the principal, as a session's created_by shows it (user:...)")
    erase.add_argument("--namespace", default="default")
    erase.set_defaults(func=erase_user)

    migrate = verbs.add_parser(
        "migrate",
        help="move a home written by the old embedded store (qdrant/) into Qdrant Edge (memory/); "
        "the memory service must be stopped (it also migrates on its first start)",
    )
    migrate.set_defaults(func=migrate_home)

    from agentmesh.cli import memory_blocks  # argparse only: its RPCs import gRPC when they run

    memory_blocks.register(verbs)


def _struct(value: dict | None) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    if value:
        s.update(value)
    return s


async def _call(method_name: str, request):
    settings = load_settings()
    async with channel_to(settings, "memory") as channel:
        try:
            return await getattr(MemoryClient(channel).stub, method_name)(request, metadata=call_metadata(settings), timeout=120)
        except grpc.aio.AioRpcError as err:
            raise rpc_failure(err, "memory", settings) from None


async def add_memory(args) -> int:
    metadata = json.loads(args.metadata) if args.metadata else {}
    if not isinstance(metadata, dict):
        raise CliError("--metadata must be a JSON object", EXIT_USAGE)
    record = await _call(
        "Remember",
        memory_service_pb2.RememberRequest(namespace=args.namespace, text=args.text, kind=args.kind, metadata=_struct(metadata)),
    )
    print(record.id)
    return EXIT_OK


async def search_memory(args) -> int:
    request = memory_service_pb2.SearchRequest(
        namespace=args.namespace, query=args.query, k=args.k, filter=memory_service_pb2.MemoryFilter(kinds=args.kind)
    )
    reply = await _call("Search", request)
    hits = [
        {
            "id": hit.memory.id,
            "text": hit.memory.text,
            "score": hit.score,
            "kind": hit.memory.kind,
            "metadata": json_format.MessageToDict(hit.memory.metadata),
        }
        for hit in reply.hits
    ]
    if args.json:
        print_json(hits)
    elif not hits:
        print("no memories found")
    else:
        for hit in hits:
            print(f"{hit['score']:.3f}  [{hit['kind']}] {hit['text']}  ({hit['id']})")
    return EXIT_OK


def _read_jsonl(path: Path, namespace: str) -> list[memory_service_pb2.RememberRequest]:
    if not path.is_file():
        raise CliError(f"no such file: {path}", EXIT_USAGE)
    requests = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CliError(f"{path}:{number}: not valid JSON ({exc.msg})", EXIT_USAGE) from None
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
            raise CliError(f"{path}:{number}: each line needs an object with a \"text\" string", EXIT_USAGE)
        requests.append(
            memory_service_pb2.RememberRequest(
                namespace=namespace,
                text=obj["text"],
                id=str(obj.get("id", "")),
                kind=obj.get("kind", ""),
                metadata=_struct(obj.get("metadata")),
                created_at=float(obj.get("created_at", 0) or 0),
            )
        )
    return requests


async def import_memories(args) -> int:
    requests = _read_jsonl(args.file, args.namespace)
    imported = 0
    for start in range(0, len(requests), IMPORT_BATCH):
        batch = requests[start : start + IMPORT_BATCH]
        reply = await _call("Import", memory_service_pb2.ImportRequest(namespace=args.namespace, memories=batch))
        imported += reply.imported
    print(f"imported {imported} memories into {args.namespace}")
    return EXIT_OK


async def forget_memories(args) -> int:
    if not (args.ids or args.kind or args.all):
        raise CliError("say what to forget: memory ids, --kind KIND, or --all", EXIT_USAGE)
    request = memory_service_pb2.ForgetRequest(
        namespace=args.namespace, ids=args.ids, filter=memory_service_pb2.MemoryFilter(kinds=args.kind), all=args.all
    )
    reply = await _call("Forget", request)
    print(f"forgot {reply.forgotten} memories")
    return EXIT_OK


async def erase_user(args) -> int:
    # Through the gateway: it removes the sessions' workspaces (the tools service) with them.
    from agentmesh.clients.gateway import GatewayClient
    from agentmesh.v1 import sessions_pb2

    settings = load_settings()
    async with channel_to(settings, "gateway") as channel:
        try:
            reply = await GatewayClient(channel).stub.EraseUser(
                sessions_pb2.EraseUserRequest(namespace=args.namespace, user=args.user),
                metadata=call_metadata(settings), timeout=600)
        except grpc.aio.AioRpcError as err:
            raise rpc_failure(err, "gateway", settings) from None
    print(f"erased {args.user} from {args.namespace}: {len(reply.sessions)} sessions, "
          f"{reply.memories_removed} memories, {reply.usage_removed} usage records")
    return EXIT_OK


async def migrate_home(args) -> int:
    import sys

    from agentmesh.errors import FailedPrecondition
    from agentmesh.memory.edge_store import EdgeStore
    from agentmesh.memory.migrate import MARKER, local_mode_dir, migrate, needs_migration
    from agentmesh.memory.settings import MemorySettings

    settings = load_settings()
    if settings.qdrant_url:
        raise CliError("AGENTMESH_QDRANT_URL is set: memory lives in that Qdrant server, there is nothing to migrate")
    if not (local_mode_dir(settings.home) / "collection").is_dir():
        print(f"nothing to migrate: {local_mode_dir(settings.home)} holds no old store")
        return EXIT_OK
    memory_settings = settings.section(MemorySettings)
    store = EdgeStore(settings.home, layout=memory_settings.layout, index_after=memory_settings.index_after,
                      part_size=memory_settings.part_size)
    try:
        await store.open()
    except FailedPrecondition as exc:
        raise CliError(exc.message) from None
    try:
        if not needs_migration(settings.home, store):
            print(f"already migrated (see {store.root / MARKER}); the old store is still at {local_mode_dir(settings.home)}")
            return EXIT_OK

        def progress(what: str, done: int, total: int) -> None:
            width = 30
            filled = width * done // max(total, 1)
            print(f"\r{what:<40} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}", end="", file=sys.stderr)
            if done >= total:
                print(file=sys.stderr)

        counts = await migrate(settings.home, store, progress)
    finally:
        await store.close()
    print(
        f"migrated {counts['sessions']} sessions, {counts['messages']} messages and {counts['memories']} memories "
        f"into {store.root}; the old store at {local_mode_dir(settings.home)} is left for you to remove"
    )
    return EXIT_OK
