"""gRPC adapters of what the learning capabilities read from the memory service (standing
instructions), kept apart from adapters.py so they grow with those capabilities."""

from __future__ import annotations

from agentmesh.agent.instructions import Instructions
from agentmesh.memory.client import MemoryClient


class GrpcInstructions:
    """GetProfile on the memory service (its errors already name the service and its address)."""

    def __init__(self, client: MemoryClient):
        self._client = client

    async def instructions(self, namespace: str) -> Instructions:
        profile = await self._client.get_profile(namespace)
        return Instructions(soul=profile.soul, user=profile.user, project=profile.project)
