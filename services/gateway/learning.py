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
from agentmesh.rpc.errors import core_error_from_rpc

# Gateway RPCs answered by the memory RPC of the same name, request and reply unchanged.
FORWARDED = (
    "GetProfile", "SetProfile",
    "PutSkill", "ListSkills", "GetSkill", "ApproveSkill", "RemoveSkill", "SetSkillPolicy",
    "ListPromotedTools", "RemovePromotedTool",
    "ListReflections",
    # Named agents (docs/agents.md): memory keeps and validates them.
    "CreateAgent", "GetAgent", "ListAgents", "UpdateAgent", "ListAgentVersions", "RollbackAgent", "DeleteAgent",
    # Recall over conversations and memory blocks (docs/memory.md).
    "SearchConversations", "ListBlocks", "GetBlock", "RevertBlock", "ApproveBlockEdit", "RejectBlockEdit",
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
        try:
            return await getattr(self._stub, method)(request, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as err:
            if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise Unavailable(f"the memory service at {self._target} did not answer "
                                  f"({err.details() or err.code().name})") from None
            raise core_error_from_rpc(err) from None
