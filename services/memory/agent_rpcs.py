# ruff: noqa: N802 - gRPC method names, as in services/*/server.py
"""The memory service's named-agent RPCs (agents.py) as a part of MemoryServicer (server.py) of
their own: proto <-> the core's dicts, each checked against the caller's tenants as the rest of
the service's RPCs are."""

from __future__ import annotations

from typing import Any

from agentmesh.errors import NotFound, Unavailable
from agentmesh.internal.v1 import memory_service_pb2
from agentmesh.memory.agents import Agents, parse_ref
from agentmesh.memory.tenancy import TenantGuard
from agentmesh.memory.transcript_records import SessionChanges, SessionRecord
from agentmesh.memory.transcripts import Transcripts
from agentmesh.rpc.errors import translate_errors
from agentmesh.v1 import agents_pb2, common_pb2, sessions_pb2

__all__ = ["AgentRpcs", "agent_info_to_proto", "spec_from_proto"]


def spec_from_proto(spec: agents_pb2.AgentSpec) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": spec.name, "description": spec.description, "instructions": spec.instructions,
        "model": spec.model, "tools": {"allow": list(spec.tools.allow), "deny": list(spec.tools.deny)},
        "permission_mode": spec.permission_mode, "approvals": list(spec.approvals), "skills": list(spec.skills),
        "mcp_servers": list(spec.mcp_servers), "sub_agents": list(spec.sub_agents), "max_steps": spec.max_steps,
        "token_budget": spec.token_budget, "sandbox_template": spec.sandbox_template,
        "isolation": spec.isolation, "memory_scope": spec.memory_scope,
    }
    if spec.HasField("temperature"):
        out["temperature"] = spec.temperature
    if spec.HasField("top_p"):
        out["top_p"] = spec.top_p
    return out


def agent_info_to_proto(info: dict[str, Any]) -> agents_pb2.AgentInfo:
    s = info["spec"]
    spec = agents_pb2.AgentSpec(
        name=s["name"], description=s["description"], instructions=s["instructions"], model=s["model"],
        tools=common_pb2.ToolPolicy(allow=s["tools"]["allow"], deny=s["tools"]["deny"]),
        permission_mode=s["permission_mode"], approvals=s["approvals"], skills=s["skills"],
        mcp_servers=s["mcp_servers"], sub_agents=s["sub_agents"], max_steps=s["max_steps"],
        token_budget=s["token_budget"], sandbox_template=s["sandbox_template"], isolation=s["isolation"],
        memory_scope=s["memory_scope"])
    if "temperature" in s:
        spec.temperature = s["temperature"]
    if "top_p" in s:
        spec.top_p = s["top_p"]
    return agents_pb2.AgentInfo(namespace=info["namespace"], spec=spec, version=info["version"],
                                current_version=info["current_version"], created_at=info["created_at"],
                                builtin=info["builtin"], rolled_back_from=info["rolled_back_from"])


class AgentRpcs:
    """Mixed into MemoryServicer, which sets these."""

    _tenants: TenantGuard
    _agents: Agents | None
    _transcripts: Transcripts

    # --- a turn's agent, for StartTurn (server.py) ---

    async def _namespace_to_be(self, session: sessions_pb2.Session) -> str:
        """The namespace a turn opening `session` will run in: the stored session's, else the one
        it is created in — checked as the put will check it, so nothing of another tenant shows."""
        await self._tenants.may_put(session.session_id, session.namespace)
        try:
            return (await self._transcripts.get_session(session.session_id)).namespace or "default"
        except NotFound:
            return session.namespace or "default"

    async def _resolve_agent(self, request: memory_service_pb2.StartTurnRequest, namespace: str) -> dict[str, Any] | None:
        """The named agent the turn asked for, resolved to a version (as GetAgent)."""
        if not request.agent:
            return None
        if self._agents is None:
            raise Unavailable("named agents are not wired in this memory service")
        parse_ref(request.agent, "agent")
        namespace = namespace or "default"
        self._tenants.namespace(namespace, "GetAgent")
        return await self._agents.get(namespace, request.agent)

    async def _record_agent(self, request: memory_service_pb2.StartTurnRequest,
                            info: dict[str, Any] | None) -> tuple[dict[str, Any], SessionRecord] | None:
        """`info` recorded on the session as its latest turn's agent, before the message is appended."""
        if info is None:
            return None
        session = await self._transcripts.update_session(
            request.session_id, SessionChanges(agent=(info["spec"]["name"], info["version"])))
        return info, session

    def _agents_of(self, namespace: str, method: str) -> tuple[Agents, str]:
        if self._agents is None:
            raise Unavailable("named agents are not wired in this memory service")
        namespace = namespace or "default"
        self._tenants.namespace(namespace, method)
        return self._agents, namespace

    @translate_errors
    async def CreateAgent(self, request, context):
        agents, namespace = self._agents_of(request.namespace, "CreateAgent")
        return agent_info_to_proto(await agents.create(namespace, spec_from_proto(request.spec)))

    @translate_errors
    async def UpdateAgent(self, request, context):
        agents, namespace = self._agents_of(request.namespace, "UpdateAgent")
        return agent_info_to_proto(await agents.update(namespace, spec_from_proto(request.spec)))

    @translate_errors
    async def GetAgent(self, request, context):
        agents, namespace = self._agents_of(request.namespace, "GetAgent")
        return agent_info_to_proto(await agents.get(namespace, request.name))

    @translate_errors
    async def ListAgents(self, request, context):
        agents, namespace = self._agents_of(request.namespace, "ListAgents")
        return agents_pb2.ListAgentsResponse(agents=[agent_info_to_proto(i) for i in await agents.list_all(namespace)])

    @translate_errors
    async def ListAgentVersions(self, request, context):
        agents, namespace = self._agents_of(request.namespace, "ListAgentVersions")
        found = await agents.versions(namespace, request.name)
        return agents_pb2.ListAgentVersionsResponse(versions=[agent_info_to_proto(i) for i in found])

    @translate_errors
    async def RollbackAgent(self, request, context):
        agents, namespace = self._agents_of(request.namespace, "RollbackAgent")
        return agent_info_to_proto(await agents.rollback(namespace, request.name, request.version))

    @translate_errors
    async def DeleteAgent(self, request, context):
        agents, namespace = self._agents_of(request.namespace, "DeleteAgent")
        return agents_pb2.DeleteAgentResponse(removed_versions=await agents.delete(namespace, request.name))
