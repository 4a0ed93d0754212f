"""What the agent learns, through the gateway: a namespace's standing instructions, skills,
promoted tools and reflection history, all kept by the memory service (docs/agent.md). The
gateway passes each call on under its own service token, on behalf of the user who called, and
the memory service validates it (namespace, bounds, skill format) and answers; its refusals reach
the caller with their status and sentence unchanged.

The memory service's own RPCs of the same names stay open to users too, but in a cluster only the
gateway and the agent reach the memory service (helm NetworkPolicy): this is the public way in.
"""

from __future__ import annotations

from typing import Any

import grpc

from agentmesh.clients.memory import MemoryClient
from agentmesh.errors import Unavailable
from agentmesh.internal.v1 import memory_service_pb2
from agentmesh.rpc.errors import core_error_from_rpc
from agentmesh.v1 import gateway_pb2

# Gateway RPCs answered by the memory RPC of the same name, request and reply unchanged.
FORWARDED = (
    "GetProfile", "SetProfile",
    "PutSkill", "ListSkills", "GetSkill", "ApproveSkill", "RemoveSkill", "RejectSkill", "SetSkillPolicy",
    "ListPromotedTools", "RemovePromotedTool",
    "ListReflections",
    # Named agents (docs/agents.md): memory keeps and validates them.
    "CreateAgent", "GetAgent", "ListAgents", "UpdateAgent", "ListAgentVersions", "RollbackAgent", "DeleteAgent",
    # Recall over conversations and memory blocks (docs/memory.md).
    "SearchConversations", "ListBlocks", "GetBlock", "SetBlock", "RevertBlock", "ApproveBlockEdit", "RejectBlockEdit",
    "SetBlockPolicy",
    # Teams (docs/teams.md): the records a lead's team keeps in memory (team_rpcs.py).
    "ListTeamRecords", "SwapTeamRecord",
)


class MemoryLearning:
    def __init__(self, client: MemoryClient, timeout_s: float = 30.0):
        self._stub = client.stub
        self._target = client.target
        self._timeout_s = timeout_s

    async def forward(self, method: str, request: Any) -> Any:
        if method not in FORWARDED:
            raise ValueError(f"{method} is not a learning RPC")
        return await self._call(method, request)

    # A namespace's long-term memories for the console's memory view: memory's records as the
    # public MemoryHit (with provenance), the namespace already checked by the caller.

    async def list_memories(self, request: gateway_pb2.ListMemoriesRequest) -> gateway_pb2.ListMemoriesResponse:
        reply = await self._call("ListMemories", memory_service_pb2.ListMemoriesRequest(
            namespace=request.namespace, page_size=request.page_size, page_token=request.page_token,
            filter=memory_service_pb2.MemoryFilter(kinds=list(request.kinds))))
        return gateway_pb2.ListMemoriesResponse(memories=[memory_hit(m) for m in reply.memories],
                                                next_page_token=reply.next_page_token)

    async def get_memory(self, request: gateway_pb2.MemoryRef) -> gateway_pb2.MemoryHit:
        reply = await self._call("GetMemory", memory_service_pb2.GetMemoryRequest(namespace=request.namespace, id=request.id))
        return memory_hit(reply)

    async def forget_memory(self, request: gateway_pb2.MemoryRef) -> gateway_pb2.ForgetMemoryResponse:
        reply = await self._call("Forget", memory_service_pb2.ForgetRequest(namespace=request.namespace, ids=[request.id]))
        return gateway_pb2.ForgetMemoryResponse(forgotten=reply.forgotten)

    async def _call(self, method: str, request: Any) -> Any:
        try:
            return await getattr(self._stub, method)(request, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as err:
            if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise Unavailable(f"the memory service at {self._target} did not answer "
                                  f"({err.details() or err.code().name})") from None
            raise core_error_from_rpc(err) from None


def memory_hit(record: memory_service_pb2.MemoryRecord) -> gateway_pb2.MemoryHit:
    hit = gateway_pb2.MemoryHit(id=record.id, text=record.text, kind=record.kind, created_at=record.created_at,
                                updated_at=record.updated_at, source_session_id=record.source_session_id)
    hit.metadata.CopyFrom(record.metadata)
    return hit
