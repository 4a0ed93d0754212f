from __future__ import annotations

import httpx
import pytest

from agentmesh.agent.providers.base import build_timeout
from tests.agent.agent_fakes import RecordingTelemetry


@pytest.fixture
async def http():
    async with httpx.AsyncClient(timeout=build_timeout(10, 2)) as client:
        yield client


@pytest.fixture
def telemetry():
    t = RecordingTelemetry()
    yield t
    t.shutdown()
