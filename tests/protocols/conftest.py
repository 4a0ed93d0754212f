"""Open protocols: the gateway as an A2A agent and an MCP server, reached with the official SDKs'
clients (a2a-sdk, mcp) over real HTTP, in front of the whole stack and the scripted model."""

from __future__ import annotations

import pytest

from tests.support.stack import Stack

TOKEN = "a2a-test-token-0123456789"


@pytest.fixture
async def stack(tmp_path, llm):
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env={"AGENTMESH_AUTH_TOKENS": TOKEN}) as running:
        yield running
