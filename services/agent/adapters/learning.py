"""gRPC adapters of what the learning capabilities read from the memory service (standing
instructions, skills, promoted tools), kept apart from memory.py so they grow with those capabilities."""

from __future__ import annotations

import json

from google.protobuf import json_format

from agentmesh.agent.capabilities.instructions import Instructions
from agentmesh.agent.capabilities.promoted_tools import StoredTool
from agentmesh.agent.capabilities.reflection import Entry
from agentmesh.agent.capabilities.skills import SkillPackage, SkillSummary
from agentmesh.clients.memory import MemoryClient
from agentmesh.errors import NotFound
from agentmesh.rpc.convert import image_from_proto
from agentmesh.v1 import common_pb2, learning_pb2


def instructions_from_proto(profile: learning_pb2.Profile) -> Instructions:
    return Instructions(soul=profile.soul, user=profile.user, project=profile.project,
                        blocks=tuple((b.name, b.text) for b in profile.blocks if b.text.strip()))


def skill_summary_from_proto(s: learning_pb2.SkillInfo) -> SkillSummary:
    return SkillSummary(s.name, s.description, s.version)


class GrpcInstructions:
    """GetProfile on the memory service (its errors already name the service and its address)."""

    def __init__(self, client: MemoryClient):
        self._client = client

    async def instructions(self, namespace: str) -> Instructions:
        return instructions_from_proto(await self._client.get_profile(namespace))


class GrpcSkills:
    """ListSkills / GetSkill on the memory service."""

    def __init__(self, client: MemoryClient):
        self._client = client

    async def skills(self, namespace: str) -> list[SkillSummary]:
        return [skill_summary_from_proto(s) for s in await self._client.list_skills(namespace)]

    async def skill(self, namespace: str, name: str) -> SkillPackage:
        found = await self._client.get_skill(name, namespace=namespace)
        if found.info.status != "active":  # a draft is not the model's to load
            raise NotFound(f"skill {name!r} is a draft awaiting approval")
        return SkillPackage(name=found.info.name, version=found.info.version, body=found.body,
                            files=tuple((f.path, f.content) for f in found.files if f.path != "SKILL.md"))


def stored_tool_from_proto(t: learning_pb2.PromotedTool) -> StoredTool:
    return StoredTool(name=t.name, description=t.description, parameters=json.loads(t.parameters_json),
                      source=t.source, function=t.function, version=t.version)


class GrpcPromotedTools:
    """PutPromotedTool / ListPromotedTools on the memory service."""

    def __init__(self, client: MemoryClient):
        self._client = client

    async def list(self, namespace: str) -> list[StoredTool]:
        return [stored_tool_from_proto(t) for t in await self._client.list_promoted_tools(namespace)]

    async def put(self, namespace: str, tool: StoredTool, origin: str) -> StoredTool:
        record = learning_pb2.PromotedTool(namespace=namespace, name=tool.name, description=tool.description,
                                         parameters_json=json.dumps(tool.parameters), source=tool.source,
                                         function=tool.function, origin=origin)
        return stored_tool_from_proto(await self._client.put_promoted_tool(record))


def _entry_text(m: common_pb2.Message) -> str:
    calls = " ".join(f"{c.name}({c.arguments_json})" for c in m.tool_calls)
    # Reflection reads text: each image is said in a line ("[image: shot.png, 6×5 PNG]"), not dropped.
    text = "\n".join([m.content.strip(), *(image_from_proto(i).described() for i in m.images)]).strip()
    if m.role == "tool":
        return f"{m.name} -> {text}"
    return f"{text} [calls: {calls}]" if calls else text


class GrpcReflectionBackend:
    """What reflection reads and writes, on the memory service."""

    def __init__(self, client: MemoryClient):
        self._client = client

    async def session_of(self, session_id: str) -> tuple[str, str]:
        session = await self._client.get_session(session_id)
        return session.namespace or "default", session.model

    async def last_seq(self, namespace: str, session_id: str) -> int:
        return (await self._client.reflection_state(session_id, namespace=namespace)).last_seq

    async def entries_after(self, session_id: str, after_seq: int) -> list[Entry]:
        entries: list[Entry] = []
        while True:
            page, after_seq = await self._client.list_messages(session_id, after_seq=after_seq, page_size=500)
            # Compaction summaries stand in for what was already read; the raw entries matter.
            entries += [Entry(m.seq, m.role, _entry_text(m)) for m in page if m.kind != "summary"]
            if not after_seq:
                return entries

    async def existing_text(self, namespace: str, memory_id: str) -> str | None:
        try:
            return (await self._client.get_memory(memory_id, namespace=namespace)).text
        except NotFound:
            return None

    async def remember(self, namespace: str, memory_id: str, kind: str, text: str, metadata: dict,
                       session_id: str) -> None:
        await self._client.remember(text, namespace=namespace, kind=kind, metadata=metadata, id=memory_id,
                                    source_session_id=session_id)

    async def propose_skill(self, namespace: str, skill_md: str, source: str) -> None:
        request = learning_pb2.PutSkillRequest(namespace=namespace, draft=True, source=source,
                                             files=[learning_pb2.SkillFile(path="SKILL.md", content=skill_md)])
        await self._client.put_skill(request)

    async def record(self, run: dict) -> None:
        await self._client.record_reflection(json_format.ParseDict(run, learning_pb2.ReflectionRun()))
