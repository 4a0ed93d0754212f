from __future__ import annotations

import pytest

from tests.gateway_routing.replicas import BACKENDS, Replicas
from tests.support.stack import Stack

APPROVAL_ENV = {"AGENTMESH_AGENT_APPROVAL_TOOLS": "shell"}


@pytest.fixture
async def backends(tmp_path, llm):
    """memory, tools and agent; the gateways are the tests' own."""
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=APPROVAL_ENV, services=BACKENDS) as running:
        yield running


@pytest.fixture
async def replicas(backends):
    async with Replicas(backends, count=2) as running:
        yield running
