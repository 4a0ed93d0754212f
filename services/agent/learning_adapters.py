"""gRPC adapters of what the learning capabilities read from the memory service (standing
instructions, skills, promoted tools), kept apart from adapters.py so they grow with those capabilities."""

from __future__ import annotations

from agentmesh.errors import NotFound
import json

from agentmesh.agent.instructions import Instructions
from agentmesh.agent.promoted_tools import StoredTool
from agentmesh.agent.skills import SkillPackage, SkillSummary
from agentmesh.memory.client import MemoryClient
from agentmesh.v1 import memory_pb2


class GrpcInstructions:
    """GetProfile on the memory service (its errors already name the service and its address)."""

    def __init__(self, client: MemoryClient):
        self._client = client

    async def instructions(self, namespace: str) -> Instructions:
        profile = await self._client.get_profile(namespace)
        return Instructions(soul=profile.soul, user=profile.user, project=profile.project)


class GrpcSkills:
    """ListSkills / GetSkill on the memory service."""

    def __init__(self, client: MemoryClient):
        self._client = client

    async def skills(self, namespace: str) -> list[SkillSummary]:
        return [SkillSummary(s.name, s.description, s.version) for s in await self._client.list_skills(namespace)]

    async def skill(self, namespace: str, name: str) -> SkillPackage:
        found = await self._client.get_skill(name, namespace=namespace)
        if found.info.status != "active":  # a draft is not the model's to load
            raise NotFound(f"skill {name!r} is a draft awaiting approval")
        return SkillPackage(name=found.info.name, version=found.info.version, body=found.body,
                            files=tuple((f.path, f.content) for f in found.files if f.path != "SKILL.md"))


def _stored(t: memory_pb2.PromotedTool) -> StoredTool:
    return StoredTool(name=t.name, description=t.description, parameters=json.loads(t.parameters_json),
                      source=t.source, function=t.function, version=t.version)


class GrpcPromotedTools:
    """PutPromotedTool / ListPromotedTools on the memory service."""

    def __init__(self, client: MemoryClient):
        self._client = client

    async def list(self, namespace: str) -> list[StoredTool]:
        return [_stored(t) for t in await self._client.list_promoted_tools(namespace)]

    async def put(self, namespace: str, tool: StoredTool, origin: str) -> StoredTool:
        record = memory_pb2.PromotedTool(namespace=namespace, name=tool.name, description=tool.description,
                                         parameters_json=json.dumps(tool.parameters), source=tool.source,
                                         function=tool.function, origin=origin)
        return _stored(await self._client.put_promoted_tool(record))
