# ruff: noqa: N802 - gRPC method names, as in services/*/server.py
"""The memory service's learning RPCs — standing instructions, skills, promoted tools and
reflection runs — as a part of MemoryServicer (server.py) of their own: proto <-> core types,
each checked against the caller's tenants as the rest of the service's RPCs are."""

from __future__ import annotations

from google.protobuf import json_format

from agentmesh.internal.v1 import memory_service_pb2
from agentmesh.memory.profiles import Profile, Profiles
from agentmesh.memory.promoted import PromotedTool, PromotedTools
from agentmesh.memory.reflections import Reflections
from agentmesh.memory.skills import Skill, SkillFile, SkillInfo, Skills
from agentmesh.memory.tenancy import TenantGuard
from agentmesh.rpc.auth import current_principal
from agentmesh.rpc.errors import translate_errors
from agentmesh.v1 import learning_pb2

__all__ = ["LearningRpcs", "profile_to_proto", "promoted_to_proto", "skill_info_to_proto"]


class LearningRpcs:
    """Mixed into MemoryServicer, which sets these."""

    _tenants: TenantGuard
    _profiles: Profiles
    _skills: Skills
    _promoted: PromotedTools
    _reflections: Reflections

    # --- standing instructions ---

    @translate_errors
    async def GetProfile(self, request, context):
        self._tenants.namespace(request.namespace or "default", "GetProfile")
        profile = profile_to_proto(await self._profiles.get(request.namespace))
        blocks = getattr(self, "_blocks", None)  # recall_rpcs.py's, mixed into the same servicer
        if blocks is not None:
            # The memory blocks ride with the standing instructions, as StartTurn sends them.
            from agentmesh.memory.recall_rpcs import block_to_proto, block_user
            profile.blocks.extend(block_to_proto(b) for b in await blocks.list(request.namespace, block_user()))
        return profile

    @translate_errors
    async def SetProfile(self, request, context):
        self._tenants.namespace(request.namespace or "default", "SetProfile")
        return profile_to_proto(await self._profiles.set(request.namespace, request.part, request.text))

    # --- skills ---

    @translate_errors
    async def PutSkill(self, request, context):
        self._tenants.namespace(request.namespace or "default", "PutSkill")
        files = [SkillFile(f.path, f.content) for f in request.files]
        # The agent (reflection) only proposes: its skills wait for a person. The gateway calls
        # on behalf of the user who asked, and stores what that user chose.
        principal = current_principal.get()
        draft = request.draft or bool(principal is not None and principal.via == "agent")
        info = await self._skills.put(request.namespace, files, draft=draft, source=request.source or "api")
        return skill_info_to_proto(info)

    @translate_errors
    async def ListSkills(self, request, context):
        self._tenants.namespace(request.namespace or "default", "ListSkills")
        found = await self._skills.list(request.namespace, include_drafts=request.include_drafts)
        return learning_pb2.ListSkillsResponse(skills=[skill_info_to_proto(i) for i in found])

    @translate_errors
    async def GetSkill(self, request, context):
        self._tenants.namespace(request.namespace or "default", "GetSkill")
        return skill_to_proto(await self._skills.get(request.namespace, request.name, request.version))

    @translate_errors
    async def ApproveSkill(self, request, context):
        self._tenants.namespace(request.namespace or "default", "ApproveSkill")
        return skill_info_to_proto(await self._skills.approve(request.namespace, request.name))

    @translate_errors
    async def RemoveSkill(self, request, context):
        self._tenants.namespace(request.namespace or "default", "RemoveSkill")
        return learning_pb2.RemoveSkillResponse(removed_versions=await self._skills.remove(request.namespace, request.name))

    @translate_errors
    async def RejectSkill(self, request, context):
        self._tenants.namespace(request.namespace or "default", "RejectSkill")
        return learning_pb2.RemoveSkillResponse(removed_versions=await self._skills.reject(request.namespace, request.name))

    @translate_errors
    async def SetSkillPolicy(self, request, context):
        self._tenants.namespace(request.namespace or "default", "SetSkillPolicy")
        auto = await self._skills.set_policy(request.namespace, request.auto_accept)
        return learning_pb2.SkillPolicy(namespace=request.namespace or "default", auto_accept=auto)

    # --- promoted tools ---

    @translate_errors
    async def PutPromotedTool(self, request, context):
        self._tenants.namespace(request.namespace or "default", "PutPromotedTool")
        tool = PromotedTool(namespace=request.namespace, name=request.name, description=request.description,
                            parameters_json=request.parameters_json, source=request.source,
                            function=request.function, origin=request.origin)
        return promoted_to_proto(await self._promoted.put(tool))

    @translate_errors
    async def RestorePromotedTool(self, request, context):
        self._tenants.namespace(request.namespace or "default", "RestorePromotedTool")
        tool = PromotedTool(namespace=request.namespace, name=request.name, description=request.description,
                            parameters_json=request.parameters_json, source=request.source,
                            function=request.function, origin="import")
        return promoted_to_proto(await self._promoted.put(tool))

    @translate_errors
    async def ListPromotedTools(self, request, context):
        self._tenants.namespace(request.namespace or "default", "ListPromotedTools")
        found = await self._promoted.list(request.namespace)
        return learning_pb2.ListPromotedToolsResponse(tools=[promoted_to_proto(t) for t in found])

    @translate_errors
    async def RemovePromotedTool(self, request, context):
        self._tenants.namespace(request.namespace or "default", "RemovePromotedTool")
        return learning_pb2.RemoveSkillResponse(removed_versions=await self._promoted.remove(request.namespace, request.name))

    # --- reflection ---

    @translate_errors
    async def GetReflectionState(self, request, context):
        self._tenants.namespace(request.namespace or "default", "GetReflectionState")
        return state_to_proto(await self._reflections.state(request.namespace, request.session_id))

    @translate_errors
    async def RecordReflection(self, request, context):
        self._tenants.namespace(request.namespace or "default", "RecordReflection")
        return state_to_proto(await self._reflections.record(run_to_dict(request)))

    @translate_errors
    async def ListReflections(self, request, context):
        self._tenants.namespace(request.namespace or "default", "ListReflections")
        runs = await self._reflections.list(request.namespace, request.session_id, request.limit)
        return learning_pb2.ListReflectionsResponse(runs=[run_from_dict(r) for r in runs])


def run_to_dict(run: learning_pb2.ReflectionRun) -> dict:
    return json_format.MessageToDict(run, preserving_proto_field_name=True)


def run_from_dict(run: dict) -> learning_pb2.ReflectionRun:
    return json_format.ParseDict(run, learning_pb2.ReflectionRun(), ignore_unknown_fields=True)


def state_to_proto(state: dict) -> memory_service_pb2.ReflectionState:
    return memory_service_pb2.ReflectionState(session_id=state["session_id"], last_seq=int(state["last_seq"]),
                                      runs=[run_from_dict(r) for r in state["runs"]])


def promoted_to_proto(t: PromotedTool) -> learning_pb2.PromotedTool:
    return learning_pb2.PromotedTool(namespace=t.namespace, name=t.name, description=t.description,
                                   parameters_json=t.parameters_json, source=t.source, function=t.function,
                                   version=t.version, created_at=t.created_at, origin=t.origin)


def skill_info_to_proto(i: SkillInfo) -> learning_pb2.SkillInfo:
    return learning_pb2.SkillInfo(namespace=i.namespace, name=i.name, description=i.description, version=i.version,
                                status=i.status, paths=list(i.paths), created_at=i.created_at, source=i.source)


def skill_to_proto(s: Skill) -> learning_pb2.Skill:
    return learning_pb2.Skill(info=skill_info_to_proto(s.info), body=s.body,
                            files=[learning_pb2.SkillFile(path=f.path, content=f.content) for f in s.files])


def profile_to_proto(p: Profile) -> learning_pb2.Profile:
    return learning_pb2.Profile(namespace=p.namespace, soul=p.soul, user=p.user, project=p.project,
                              updated_at=p.updated_at, max_chars=p.max_chars)
