"""What the team e2e tests share: reading a scripted agent's conversation (who it is, the tools
it called, what came back to it) and the `llm` and `stack` fixtures of a team test."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from tests.support.llm_server import ScriptedLLMServer
from tests.support.stack import Stack

# The team settings most team tests run with: a teammate waits for mail rather than ending.
WAITING_TEAM_ENV = {"AGENTMESH_AGENT_TEAM_IDLE_S": "120", "AGENTMESH_AGENT_TEAM_INBOX_WAIT_S": "120"}


def agent_of(messages, mates: tuple[str, ...] = ("alice",)) -> str:
    """The agent a conversation is of: the teammate its system prompt names, else the lead."""
    system = str(messages[0].get("content") or "") if messages else ""
    for name in mates:
        if f"You are {name}, a teammate" in system:
            return name
    return "lead"


def tool_calls_of(messages) -> list[tuple[str, dict]]:
    """Each tool call the conversation's assistant made, as (name, arguments)."""
    return [(c["function"]["name"], json.loads(c["function"]["arguments"] or "{}"))
            for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]


def seen_by(messages) -> str:
    """All that reached the agent: its tool results and user messages."""
    return "\n".join(str(m.get("content") or "") for m in messages if m["role"] in ("tool", "user"))


def team_fixtures(make_script: Callable[[], Callable], env: dict[str, str]):
    """The `llm` fixture (a scripted model answering every agent with a fresh `make_script()`)
    and the `stack` fixture (the services with `env`) of a team test module:
    `llm, stack = team_fixtures(lambda: route, WAITING_TEAM_ENV)`."""

    @pytest.fixture
    def llm():
        with ScriptedLLMServer(default=make_script()) as server:
            yield server

    @pytest.fixture
    async def stack(tmp_path, llm):
        async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=env) as running:
            yield running

    return llm, stack
