"""The import side of `agentmesh import` (export.py reads and checks the file): each record
written through the RPC that checks it, memories in batches, nothing overwritten unless asked.
"""

from __future__ import annotations

import sys
from typing import Any, Iterator

from agentmesh.cli.common import EXIT_SERVER_ERROR, CliError

BATCH = 256
RESTORE_BATCH = 1000  # messages a RestoreSession call takes
# A job's fields the scheduler sets itself; the rest are what a client gives on create.
_JOB_OUTPUT = ("job_id", "created_at", "updated_at", "next_run_at", "last_run_at", "done_at", "source")


class Importer:
    def __init__(self, call, namespace: str, replace: bool, progress, embedder: str = ""):
        self._call = call
        self._embedder = embedder  # what the file's vectors are of ("NAME:DIM"), if it has any
        self._namespace = namespace
        self._replace = replace
        self._progress = progress
        self._memories: list[Any] = []
        self.counts: dict[str, int] = {}

    def _count(self, kind: str, n: int = 1) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + n
        self._progress.tick(n)

    async def check_embedder(self, has_vectors: bool) -> None:
        """Says whether the file's vectors will be kept or the texts embedded again."""
        if not has_vectors:
            return
        from agentmesh.internal.v1 import memory_service_pb2

        probe = await self._call(self._call.memory.ListMemories, memory_service_pb2.ListMemoriesRequest(
            namespace=self._namespace, page_size=1))
        if probe.embedder != self._embedder:
            sys.stderr.write(f"the file's vectors are of {self._embedder or 'an unnamed embedder'}, this home embeds "
                             f"with {probe.embedder}: the memories' texts are embedded again\n")

    async def refuse_overwrites(self, lines: Iterator[tuple[int, dict[str, Any]]]) -> None:
        """Before anything is written: what of the target the file would overwrite, refused in
        one sentence unless --replace."""
        if self._replace:
            return
        from agentmesh.internal.v1 import memory_service_pb2
        from agentmesh.v1 import learning_pb2, sessions_pb2

        call, ns, found = self._call, self._namespace, []
        if (await call(call.memory.ListMemories, memory_service_pb2.ListMemoriesRequest(namespace=ns, page_size=1))).memories:
            found.append("memories")
        profile = await call(call.gateway.GetProfile, learning_pb2.GetProfileRequest(namespace=ns))
        if profile.soul or profile.user or profile.project:
            found.append("standing instructions")
        blocks = await call(call.gateway.ListBlocks, learning_pb2.ListBlocksRequest(namespace=ns, all_users=True))
        if blocks.blocks:
            found.append("memory blocks")
        skills = await call(call.gateway.ListSkills, learning_pb2.ListSkillsRequest(namespace=ns, include_drafts=True))
        if skills.skills:
            found.append("skills")
        tools = await call(call.gateway.ListPromotedTools, learning_pb2.ListPromotedToolsRequest(namespace=ns))
        if tools.tools:
            found.append("self-made tools")
        settings = await call(call.gateway.GetNamespaceSettings, sessions_pb2.GetNamespaceSettingsRequest(namespace=ns))
        if settings.updated_at:
            found.append("settings")
        from agentmesh.v1 import agents_pb2

        agents = await call(call.gateway.ListAgents, agents_pb2.ListAgentsRequest(namespace=ns))
        names = [a.spec.name for a in agents.agents if not a.builtin]
        if names:
            found.append(f"agents ({', '.join(names)})")
        import grpc

        for _, record in lines:
            if record.get("kind") != "session":
                continue
            session_id = str(record.get("session", {}).get("session_id", ""))
            try:
                await call(call.gateway.GetSession, sessions_pb2.GetSessionRequest(session_id=session_id))
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.NOT_FOUND:
                    continue
                raise
            found.append(f"session {session_id}")
            break
        if found:
            raise CliError(f"namespace {ns!r} already holds {', '.join(found)}: nothing was imported; "
                           "import into a new namespace, or pass --replace to overwrite", EXIT_SERVER_ERROR)

    async def run(self, lines: Iterator[tuple[int, dict[str, Any]]]) -> dict[str, int]:
        handlers = {"settings": self._settings, "profile": self._profile, "block_policy": self._block_policy,
                    "block": self._block, "skill": self._skill,
                    "promoted_tool": self._promoted_tool, "agent": self._agent, "memory": self._memory, "session": self._session,
                    "job": self._job}
        for number, record in lines:
            kind = record.get("kind")
            if number == 1 or kind == "end":
                continue
            handler = handlers.get(str(kind))
            if handler is None:
                sys.stderr.write(f"line {number}: a record of kind {kind!r} this version does not know; skipped\n")
                continue
            await handler(record)
        await self._flush_memories()
        return self.counts

    async def _settings(self, r: dict[str, Any]) -> None:
        from google.protobuf.json_format import ParseDict

        from agentmesh.v1 import common_pb2, sessions_pb2

        request = sessions_pb2.UpdateNamespaceSettingsRequest(namespace=self._namespace)
        request.tools.CopyFrom(ParseDict(r.get("tools") or {}, common_pb2.ToolPolicy()))
        request.retention.CopyFrom(ParseDict(r.get("retention") or {}, sessions_pb2.Retention()))
        await self._call(self._call.gateway.UpdateNamespaceSettings, request)
        self._count("settings")

    async def _profile(self, r: dict[str, Any]) -> None:
        from agentmesh.v1 import learning_pb2

        for part in ("soul", "user", "project"):
            if r.get(part):
                await self._call(self._call.gateway.SetProfile, learning_pb2.SetProfileRequest(
                    namespace=self._namespace, part=part, text=str(r[part])))
        self._count("profile")

    async def _block_policy(self, r: dict[str, Any]) -> None:
        from agentmesh.v1 import learning_pb2

        await self._call(self._call.gateway.SetBlockPolicy, learning_pb2.BlockPolicy(
            namespace=self._namespace, edits=str(r.get("edits") or "apply")))
        self._count("block_policy")

    async def _block(self, r: dict[str, Any]) -> None:
        """The block with its history (RestoreBlock: versions, their provenance and times kept)."""
        from google.protobuf.json_format import ParseDict

        from agentmesh.internal.v1 import memory_service_pb2
        from agentmesh.v1 import learning_pb2

        block = learning_pb2.MemoryBlock(namespace=self._namespace, name=str(r.get("name", "")),
                                         user=str(r.get("user", "")))
        for v in r.get("versions") or []:
            block.versions.append(ParseDict(v, learning_pb2.BlockVersion(), ignore_unknown_fields=True))
        await self._call(self._call.memory.RestoreBlock, memory_service_pb2.RestoreBlockRequest(
            block=block, replace=self._replace))
        self._count("block")

    async def _skill(self, r: dict[str, Any]) -> None:
        from agentmesh.v1 import learning_pb2

        files = [learning_pb2.SkillFile(path=f["path"], content=f["content"]) for f in r.get("files", [])]
        await self._call(self._call.gateway.PutSkill, learning_pb2.PutSkillRequest(
            namespace=self._namespace, files=files, draft=r.get("status") == "draft", source="import"))
        self._count("skill")

    async def _promoted_tool(self, r: dict[str, Any]) -> None:
        """A self-made tool, checked as promoting checks one: its description and argument schema
        derived again from its source (the file's are not trusted), a source that does not define
        a documented function skipped with a sentence. Memory checks the rest (name, size, cap)."""
        import json

        from agentmesh.agent.capabilities import toolmaker
        from agentmesh.v1 import learning_pb2

        name, function, source = str(r.get("name", "")), str(r.get("function", "")), str(r.get("source", ""))
        try:
            made = toolmaker.describe(source, function)
        except toolmaker.ToolRefused as exc:
            sys.stderr.write(f"self-made tool {name!r} is not imported: {exc}\n")
            self.counts["promoted_tool skipped"] = self.counts.get("promoted_tool skipped", 0) + 1
            return
        await self._call(self._call.memory.RestorePromotedTool, learning_pb2.PromotedTool(
            namespace=self._namespace, name=name, description=made.description,
            parameters_json=json.dumps(made.parameters), source=source, function=function))
        self._count("promoted_tool")

    async def _agent(self, r: dict[str, Any]) -> None:
        """The agent's versions made again oldest first (CreateAgent, then UpdateAgent), each
        checked as a client's; with --replace an agent of that name is removed first."""
        import grpc
        from google.protobuf.json_format import ParseDict

        from agentmesh.v1 import agents_pb2

        call, name = self._call, str(r.get("name", ""))
        specs = [ParseDict(v.get("spec") or {}, agents_pb2.AgentSpec(), ignore_unknown_fields=True)
                 for v in r.get("versions") or []]
        if not specs:
            return
        if self._replace:
            try:
                await call(call.gateway.DeleteAgent, agents_pb2.DeleteAgentRequest(namespace=self._namespace, name=name))
            except grpc.aio.AioRpcError as err:
                if err.code() != grpc.StatusCode.NOT_FOUND:
                    raise
        for number, spec in enumerate(specs):
            spec.name = name
            if number == 0:
                await call(call.gateway.CreateAgent, agents_pb2.CreateAgentRequest(namespace=self._namespace, spec=spec))
            else:
                await call(call.gateway.UpdateAgent, agents_pb2.UpdateAgentRequest(namespace=self._namespace, spec=spec))
        self._count("agent")

    async def _memory(self, r: dict[str, Any]) -> None:
        from google.protobuf import struct_pb2

        from agentmesh.cli.export import unpack_vector
        from agentmesh.internal.v1 import memory_service_pb2

        metadata = struct_pb2.Struct()
        metadata.update(r.get("metadata") or {})
        self._memories.append(memory_service_pb2.RememberRequest(
            namespace=self._namespace, text=str(r.get("text", "")), kind=str(r.get("memory_kind", "")),
            metadata=metadata, id=str(r.get("id", "")), source_session_id=str(r.get("source_session_id", "")),
            created_at=float(r.get("created_at") or 0),
            vector=unpack_vector(str(r["vector_f32"])) if r.get("vector_f32") else []))
        if len(self._memories) >= BATCH:
            await self._flush_memories()

    async def _flush_memories(self) -> None:
        if not self._memories:
            return
        from agentmesh.internal.v1 import memory_service_pb2

        batch, self._memories = self._memories, []
        reply = await self._call(self._call.memory.Import, memory_service_pb2.ImportRequest(
            namespace=self._namespace, memories=batch, embedder=self._embedder))
        self._count("memory", int(reply.imported))

    async def _session(self, r: dict[str, Any]) -> None:
        from google.protobuf.json_format import ParseDict

        from agentmesh.internal.v1 import memory_service_pb2
        from agentmesh.v1 import common_pb2, sessions_pb2

        session = ParseDict(r.get("session") or {}, sessions_pb2.Session(), ignore_unknown_fields=True)
        session.namespace = self._namespace
        messages = [ParseDict(m, common_pb2.Message(), ignore_unknown_fields=True) for m in r.get("messages", [])]
        for m in messages:
            m.ClearField("seq")  # positions are the receiving transcript's to give
        # A long transcript goes in batches: the first restores the session, the rest continue it.
        for first in range(0, max(len(messages), 1), RESTORE_BATCH):
            await self._call(self._call.memory.RestoreSession, memory_service_pb2.RestoreSessionRequest(
                session=session, messages=messages[first:first + RESTORE_BATCH], replace=self._replace,
                continues=first > 0))
        self._count("session")

    async def _job(self, r: dict[str, Any]) -> None:
        from google.protobuf.json_format import ParseDict

        from agentmesh.v1 import scheduler_pb2

        fields = {k: v for k, v in (r.get("job") or {}).items() if k not in _JOB_OUTPUT}
        if (r.get("job") or {}).get("done_at"):
            return  # a one-off job that already ran has nothing left to do
        job = ParseDict(fields, scheduler_pb2.Job(), ignore_unknown_fields=True)
        await self._call(self._call.scheduler.CreateJob, scheduler_pb2.CreateJobRequest(job=job))
        self._count("job")
