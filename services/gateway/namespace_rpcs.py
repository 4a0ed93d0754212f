# ruff: noqa: N802 - gRPC method names, as in services/*/server.py
"""The gateway's RPCs over a namespace's records that the memory service keeps and checks:
standing instructions, skills, named agents, promoted tools, memory blocks, recall over
conversations, reflections. Each is the caller's role checked in the tenant that owns the
namespace, then the call passed to memory (learning.py), which validates it and checks again.

A mixin of `GatewayServicer` (server.py), which sets `_authz`, `_learning` and `_reflect`.
"""

from __future__ import annotations

from agentmesh import error_reasons
from agentmesh.agent_manifest import CONTROLLER_SUBJECT
from agentmesh.errors import FailedPrecondition, InvalidArgument, Unavailable
from agentmesh.gateway.authz import Authorizer, Caller
from agentmesh.gateway.learning import MemoryLearning
from agentmesh.gateway.reflect import AgentReflect
from agentmesh.ids import validate_namespace
from agentmesh.rpc.auth import current_principal, scope_of_call
from agentmesh.rpc.errors import translate_errors

__all__ = ["MAX_MEMORY_PAGE", "NamespaceRecordRpcs", "current_caller"]

MAX_MEMORY_PAGE = 200


def current_caller() -> Caller:
    """Who this call is for and what they may see, as the interceptor established it."""
    principal = current_principal.get()
    return Caller(subject=principal.subject if principal else "user:anonymous", scope=scope_of_call(),
                  principal=principal)



class NamespaceRecordRpcs:
    _authz: Authorizer | None
    _learning: MemoryLearning | None
    _reflect: AgentReflect | None
    # Namespaces whose agents Kubernetes `Agent` resources define (AGENTMESH_MANAGED_AGENT_NAMESPACES).
    managed_agent_namespaces: frozenset[str] = frozenset()

    @translate_errors
    async def Reflect(self, request, context):
        if self._reflect is None or self._authz is None:
            raise Unavailable("reflection is not wired in this gateway")
        # NOT_FOUND for a session that does not exist or is another tenant's; member in its own.
        await self._authz.session(current_caller(), request.session_id, "Reflect")
        return await self._reflect.reflect(request)

    async def _learning_call(self, method: str, request):
        if self._learning is None or self._authz is None:
            raise Unavailable("the memory service's learning RPCs are not wired in this gateway")
        # The caller's role (REQUIRED_ROLES) in the tenant owning the namespace; memory checks again.
        request.namespace = self._authz.namespace(current_caller(), request.namespace, method)
        return await self._learning.forward(method, request)

    # A namespace's standing instructions, skills, promoted tools and reflection history: the
    # memory service keeps them and validates each call (learning.py).

    @translate_errors
    async def GetProfile(self, request, context):
        return await self._learning_call("GetProfile", request)

    @translate_errors
    async def SetProfile(self, request, context):
        return await self._learning_call("SetProfile", request)

    @translate_errors
    async def PutSkill(self, request, context):
        return await self._learning_call("PutSkill", request)

    @translate_errors
    async def ListSkills(self, request, context):
        return await self._learning_call("ListSkills", request)

    @translate_errors
    async def GetSkill(self, request, context):
        return await self._learning_call("GetSkill", request)

    @translate_errors
    async def ApproveSkill(self, request, context):
        return await self._learning_call("ApproveSkill", request)

    @translate_errors
    async def RemoveSkill(self, request, context):
        return await self._learning_call("RemoveSkill", request)

    # A namespace's long-term memories (the console's memory view): a member's, as SearchMemory.

    def _memory_namespace(self, request, method: str) -> MemoryLearning:
        if self._learning is None or self._authz is None:
            raise Unavailable("the memory service's RPCs are not wired in this gateway")
        if request.namespace:
            validate_namespace(request.namespace)
        request.namespace = self._authz.namespace(current_caller(), request.namespace, method)
        return self._learning

    @translate_errors
    async def ListMemories(self, request, context):
        if request.page_size < 0 or request.page_size > MAX_MEMORY_PAGE:
            raise InvalidArgument(f"page_size must be between 0 and {MAX_MEMORY_PAGE}, got {request.page_size}")
        return await self._memory_namespace(request, "ListMemories").list_memories(request)

    @translate_errors
    async def GetMemory(self, request, context):
        if not request.id:
            raise InvalidArgument("id is required: the memory's id, as ListMemories or SearchMemory give it")
        return await self._memory_namespace(request, "GetMemory").get_memory(request)

    @translate_errors
    async def ForgetMemory(self, request, context):
        if not request.id:
            raise InvalidArgument("id is required: the memory's id, as ListMemories or SearchMemory give it")
        learning = self._memory_namespace(request, "ForgetMemory")
        await learning.get_memory(request)  # NOT_FOUND for an id the namespace does not hold
        return await learning.forget_memory(request)

    @translate_errors
    async def RejectSkill(self, request, context):
        return await self._learning_call("RejectSkill", request)

    @translate_errors
    async def SetSkillPolicy(self, request, context):
        return await self._learning_call("SetSkillPolicy", request)

    # Named agents (docs/agents.md), kept and validated by the memory service; a change is written
    # to the audit log with who made it.

    async def _agent_change(self, method: str, request, name: str):
        if self.managed_agent_namespaces and self._authz is not None:
            caller = current_caller()
            request.namespace = self._authz.namespace(caller, request.namespace, method)
            if request.namespace in self.managed_agent_namespaces and caller.subject != CONTROLLER_SUBJECT:
                # One source of truth: an edit here would be undone by the controller's next sync.
                raise FailedPrecondition(
                    f"the agents of namespace {request.namespace!r} are defined by Kubernetes Agent resources; "
                    f"change {name!r} with kubectl (or in Git), not through the API",
                    reason=error_reasons.AGENTS_FROM_RESOURCES, metadata={"namespace": request.namespace})
        reply = await self._learning_call(method, request)
        assert self._authz is not None  # _learning_call checked it
        verb = method.removesuffix("Agent").lower()  # CreateAgent -> agent.create, as session.delete
        self._authz.audit.record(f"agent.{verb}", "allowed", current_caller().principal, method=f"gateway.{method}",
                                 namespace=request.namespace, agent=name, version=getattr(reply, "version", 0))
        return reply

    @translate_errors
    async def CreateAgent(self, request, context):
        return await self._agent_change("CreateAgent", request, request.spec.name)

    @translate_errors
    async def UpdateAgent(self, request, context):
        return await self._agent_change("UpdateAgent", request, request.spec.name)

    @translate_errors
    async def RollbackAgent(self, request, context):
        return await self._agent_change("RollbackAgent", request, request.name)

    @translate_errors
    async def DeleteAgent(self, request, context):
        return await self._agent_change("DeleteAgent", request, request.name)

    @translate_errors
    async def GetAgent(self, request, context):
        return await self._learning_call("GetAgent", request)

    @translate_errors
    async def ListAgents(self, request, context):
        return await self._learning_call("ListAgents", request)

    @translate_errors
    async def ListAgentVersions(self, request, context):
        return await self._learning_call("ListAgentVersions", request)

    @translate_errors
    async def ListPromotedTools(self, request, context):
        return await self._learning_call("ListPromotedTools", request)

    @translate_errors
    async def RemovePromotedTool(self, request, context):
        return await self._learning_call("RemovePromotedTool", request)

    # Recall over a namespace's conversations and its memory blocks, kept by the memory service.

    @translate_errors
    async def SearchConversations(self, request, context):
        return await self._learning_call("SearchConversations", request)

    @translate_errors
    async def ListBlocks(self, request, context):
        return await self._learning_call("ListBlocks", request)

    @translate_errors
    async def GetBlock(self, request, context):
        return await self._learning_call("GetBlock", request)

    @translate_errors
    async def SetBlock(self, request, context):
        return await self._learning_call("SetBlock", request)

    @translate_errors
    async def RevertBlock(self, request, context):
        return await self._learning_call("RevertBlock", request)

    @translate_errors
    async def ApproveBlockEdit(self, request, context):
        return await self._learning_call("ApproveBlockEdit", request)

    @translate_errors
    async def RejectBlockEdit(self, request, context):
        return await self._learning_call("RejectBlockEdit", request)

    @translate_errors
    async def SetBlockPolicy(self, request, context):
        return await self._learning_call("SetBlockPolicy", request)

    @translate_errors
    async def ListReflections(self, request, context):
        return await self._learning_call("ListReflections", request)
