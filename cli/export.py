"""`agentmesh export NAMESPACE > FILE` and `agentmesh import FILE --namespace NEW`: a namespace
moved between homes (docs/memory.md#export-and-import).

The file is JSON Lines, written and read as a stream, so a namespace of any size moves in the
memory of one batch: a header line (`format: agentmesh-export/3`, the namespace, the embedder
the memories were indexed with), then one record a line — `settings`, `profile`, `block_policy`,
`block` (a memory block, the namespace's or a person's, with every version), `skill`,
`promoted_tool`, `agent` (a named agent with every version), `memory`, `session` (with its
transcript), `job` — and an `end` line with the counts, so a cut-off file is told from a whole
one. Format 2 added `agent`, format 3 `block` and `block_policy`; files of formats 1 and 2 are
read as before.

Both are CLI orchestration over the services' own RPCs (an admin's token): each record goes in
through the RPC that checks it, so an import is held to every rule a client is. Memories carry
their dense vectors (`vector_f32`: base64 of little-endian float32s) unless `--text`: an import
into a home with the same embedder (the header's `embedder.id`, "NAME:DIM") keeps them and embeds
nothing; into another it embeds the texts (another model's vectors would be wrong there). The
sparse side is always made from the text.
"""

from __future__ import annotations

import base64
import json
import struct
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import grpc

from agentmesh.cli.common import EXIT_OK, EXIT_USAGE, CliError, call_metadata, channel_to, load_settings, rpc_failure

FORMAT_VERSION = 3
FORMAT = f"agentmesh-export/{FORMAT_VERSION}"
BATCH = 256
PROGRESS_EVERY = 1000


def register(subparsers) -> None:
    exp = subparsers.add_parser("export", help="write a namespace (settings, instructions, memory blocks, skills, "
                                "agents, memories, transcripts, jobs) as JSON Lines to stdout")
    exp.add_argument("namespace")
    exp.add_argument("--sessions", default="", help="only these sessions (comma-separated ids); default: all")
    exp.add_argument("--text", action="store_true", help="memories as text only, to be embedded again on import "
                     "(a smaller file); default: with their vectors")
    exp.set_defaults(func=export_namespace)
    imp = subparsers.add_parser("import", help="read an export into a namespace; refuses to overwrite "
                                "anything without --replace")
    imp.add_argument("file", type=Path)
    imp.add_argument("--namespace", required=True, help="the namespace to import into")
    imp.add_argument("--replace", action="store_true", help="overwrite what is there already")
    imp.set_defaults(func=import_namespace)


class _Progress:
    """A line on stderr every PROGRESS_EVERY records, so a long export or import shows it moves."""

    def __init__(self, verb: str):
        self.verb, self.count, self.started = verb, 0, time.monotonic()

    def tick(self, n: int = 1) -> None:
        before, self.count = self.count, self.count + n
        if before // PROGRESS_EVERY != self.count // PROGRESS_EVERY:
            sys.stderr.write(f"{self.verb} {self.count} records ({time.monotonic() - self.started:.0f} s)\n")


class _Stubs:
    def __init__(self, channels: dict[str, grpc.aio.Channel], metadata):
        from agentmesh.clients.gateway import GatewayClient, SchedulerClient
        from agentmesh.clients.memory import MemoryClient

        self.gateway = GatewayClient(channels["gateway"]).stub
        self.memory = MemoryClient(channels["memory"]).stub
        self.scheduler = SchedulerClient(channels["scheduler"]).stub
        self.metadata = metadata

    async def __call__(self, method, request):
        return await method(request, metadata=self.metadata, timeout=300)


async def _with_stubs(work) -> int:
    settings = load_settings()
    channels = {name: channel_to(settings, name) for name in ("gateway", "memory", "scheduler")}
    try:
        return await work(_Stubs(channels, call_metadata(settings)), settings)
    except grpc.aio.AioRpcError as err:
        raise rpc_failure(err, "gateway", settings) from None
    finally:
        for channel in channels.values():
            await channel.close()


def _dict(message) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict

    return MessageToDict(message, preserving_proto_field_name=True)


# ------------------------------------------------------------------------------ export


async def export_namespace(args) -> int:
    wanted = {s for s in args.sessions.split(",") if s}

    async def work(call: _Stubs, settings) -> int:
        from agentmesh.internal.v1 import memory_service_pb2

        # The memory service's embedder (not this shell's settings): what the vectors are of.
        probe = await call(call.memory.ListMemories, memory_service_pb2.ListMemoriesRequest(
            namespace=args.namespace, page_size=1))
        name, _, dim = probe.embedder.rpartition(":")
        out = sys.stdout
        counts: dict[str, int] = {}
        progress = _Progress("exported")

        def emit(record: dict[str, Any]) -> None:
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
            counts[record["kind"]] = counts.get(record["kind"], 0) + 1
            progress.tick()

        out.write(json.dumps({"format": FORMAT, "namespace": args.namespace, "exported_at": time.time(),
                              "embedder": {"name": name, "dim": int(dim or 0), "id": probe.embedder},
                              "vectors": not args.text}) + "\n")
        async for record in _records(call, args.namespace, wanted, not args.text):
            emit(record)
        out.write(json.dumps({"kind": "end", "counts": counts}) + "\n")
        out.flush()
        sys.stderr.write(f"exported {args.namespace}: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) + "\n")
        return EXIT_OK

    return await _with_stubs(work)


def pack_vector(vector) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def unpack_vector(text: str) -> list[float]:
    raw = base64.b64decode(text)
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


async def _records(call: _Stubs, namespace: str, wanted: set[str], vectors: bool):
    from agentmesh.internal.v1 import memory_service_pb2
    from agentmesh.v1 import learning_pb2, scheduler_pb2, sessions_pb2

    settings = await call(call.gateway.GetNamespaceSettings, sessions_pb2.GetNamespaceSettingsRequest(namespace=namespace))
    yield {"kind": "settings", "tools": _dict(settings.tools), "retention": _dict(settings.retention)}
    profile = await call(call.gateway.GetProfile, learning_pb2.GetProfileRequest(namespace=namespace))
    yield {"kind": "profile", "soul": profile.soul, "user": profile.user, "project": profile.project}
    async for record in _blocks(call, namespace):
        yield record
    skills = await call(call.gateway.ListSkills, learning_pb2.ListSkillsRequest(namespace=namespace, include_drafts=True))
    for info in skills.skills:
        skill = await call(call.gateway.GetSkill, learning_pb2.GetSkillRequest(namespace=namespace, name=info.name))
        yield {"kind": "skill", "name": info.name, "status": info.status, "source": info.source,
               "files": [{"path": f.path, "content": f.content} for f in skill.files]}
    tools = await call(call.gateway.ListPromotedTools, learning_pb2.ListPromotedToolsRequest(namespace=namespace))
    for tool in tools.tools:
        yield {"kind": "promoted_tool", **_dict(tool)}
    async for record in _agents(call, namespace):
        yield record
    token = ""
    while True:
        page = await call(call.memory.ListMemories, memory_service_pb2.ListMemoriesRequest(
            namespace=namespace, page_size=1000, page_token=token, with_vectors=vectors))
        for m in page.memories:
            record = {"kind": "memory", "id": m.id, "text": m.text, "memory_kind": m.kind,
                      "metadata": _dict(m.metadata), "created_at": m.created_at,
                      "source_session_id": m.source_session_id}
            if m.vector:
                record["vector_f32"] = pack_vector(m.vector)
            yield record
        token = page.next_page_token
        if not token:
            break
    exported: set[str] = set()
    token = ""
    while True:
        page = await call(call.gateway.ListSessions, sessions_pb2.ListSessionsRequest(page_size=500, page_token=token))
        for s in page.sessions:
            if s.namespace == namespace and (not wanted or s.session_id in wanted):
                exported.add(s.session_id)
                yield {"kind": "session", "session": _dict(s), "messages": await _transcript(call, s.session_id)}
        token = page.next_page_token
        if not token:
            break
    # Jobs name no namespace: the ones that run in an exported session go with it.
    jobs = await call(call.scheduler.ListJobs, scheduler_pb2.ListJobsRequest())
    for job in jobs.jobs:
        if job.session_id in exported and not job.source.startswith("file:"):
            yield {"kind": "job", "job": _dict(job)}


async def _blocks(call: _Stubs, namespace: str):
    """The edit policy, then every memory block — the namespace's and each person's `user` block
    — with every version and its provenance (drafts waiting for a person stay behind)."""
    from agentmesh.v1 import learning_pb2

    listed = await call(call.gateway.ListBlocks, learning_pb2.ListBlocksRequest(namespace=namespace, all_users=True))
    yield {"kind": "block_policy", "edits": listed.edits or "apply"}
    for head in listed.blocks:
        block = await call(call.gateway.GetBlock, learning_pb2.GetBlockRequest(
            namespace=namespace, name=head.name, user=head.user))
        versions = [_dict(v) for v in sorted(block.versions, key=lambda v: v.version)]
        if block.user != head.user or not versions:
            # A namespace `user` block from before sign-in: the exporter's calls address their
            # own, so this one goes as its current text, one version.
            versions = [{"version": head.version or 1, "text": head.text, "created_at": head.updated_at,
                         "change": "set"}]
        yield {"kind": "block", "name": head.name, "user": head.user, "text": head.text, "version": head.version,
               "updated_at": head.updated_at, "versions": versions}


async def _agents(call: _Stubs, namespace: str):
    """The namespace's named agents (not the built-ins it did not override), each with every
    version oldest first: an import makes them again in that order, so the numbers carry over."""
    from agentmesh.v1 import agents_pb2

    listed = await call(call.gateway.ListAgents, agents_pb2.ListAgentsRequest(namespace=namespace))
    for agent in listed.agents:
        if agent.builtin:
            continue
        versions = await call(call.gateway.ListAgentVersions, agents_pb2.ListAgentVersionsRequest(
            namespace=namespace, name=agent.spec.name))
        yield {"kind": "agent", "name": agent.spec.name, "current_version": agent.current_version,
               "versions": [{"version": v.version, "created_at": v.created_at, "rolled_back_from": v.rolled_back_from,
                             "spec": _dict(v.spec)} for v in sorted(versions.versions, key=lambda v: v.version)]}


async def _transcript(call: _Stubs, session_id: str) -> list[dict[str, Any]]:
    from agentmesh.v1 import sessions_pb2

    messages: list[dict[str, Any]] = []
    after = 0
    while True:
        page = await call(call.gateway.GetTranscript, sessions_pb2.GetTranscriptRequest(
            session_id=session_id, page_size=1000, after_seq=after))
        messages += [_dict(m) for m in page.messages]
        if not page.next_after_seq:
            return messages
        after = page.next_after_seq


# ------------------------------------------------------------------------------ import


def _lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        handle = sys.stdin if str(path) == "-" else path.open(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}", EXIT_USAGE) from None
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CliError(f"{path}:{number} is not JSON: {exc.msg}", EXIT_USAGE) from None
            if not isinstance(record, dict):
                raise CliError(f"{path}:{number} is not a JSON object", EXIT_USAGE)
            yield number, record


def check_header(header: dict[str, Any], path: Path) -> None:
    """Refuse, in a sentence, what is not an export this version can read."""
    name = str(header.get("format", ""))
    prefix, _, version = name.partition("/")
    if prefix != "agentmesh-export" or not version.isdigit():
        raise CliError(f"{path} is not an agentmesh export (its first line has no 'format: agentmesh-export/N')",
                       EXIT_USAGE)
    if int(version) > FORMAT_VERSION:
        raise CliError(f"{path} was written in format {name}, newer than this agentmesh reads ({FORMAT}); "
                       "import it with a newer agentmesh", EXIT_USAGE)


async def import_namespace(args) -> int:
    from agentmesh.errors import InvalidArgument
    from agentmesh.ids import validate_namespace

    try:
        namespace = validate_namespace(args.namespace)
    except InvalidArgument as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    lines = _lines(args.file)
    first = next(lines, None)
    if first is None:
        raise CliError(f"{args.file} is empty: not an agentmesh export", EXIT_USAGE)
    check_header(first[1], args.file)
    # Read to the end before writing anything: a cut-off or malformed file changes nothing.
    _check_whole(args.file)

    async def work(call: _Stubs, settings) -> int:
        from agentmesh.cli.export_import import Importer

        importer = Importer(call, namespace, args.replace, _Progress("imported"),
                            str((first[1].get("embedder") or {}).get("id", "")))
        await importer.check_embedder(bool(first[1].get("vectors")))
        await importer.refuse_overwrites(_lines(args.file))
        counts = await importer.run(_lines(args.file))
        sys.stderr.write(f"imported into {namespace}: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
                         + "\n")
        return EXIT_OK

    return await _with_stubs(work)


def _check_whole(path: Path) -> None:
    last: dict[str, Any] = {}
    for _, record in _lines(path):
        last = record
    if last.get("kind") != "end":
        raise CliError(f"{path} ends before its 'end' line: the export was cut off; export it again", EXIT_USAGE)
