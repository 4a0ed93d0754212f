"""gRPC adapter of the scheduler (filled by the scheduler work; serves health for now)."""

from __future__ import annotations

from agentmesh.config import Settings
from agentmesh.rpc.server import ServiceHost
from agentmesh.telemetry import Telemetry


async def build(settings: Settings, telemetry: Telemetry, address: str | None = None) -> ServiceHost:
    return ServiceHost("scheduler", settings, telemetry, address=address)
