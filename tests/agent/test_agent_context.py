"""Context assembly rules and the agent's settings."""

from __future__ import annotations

import datetime as dt

import pytest

from agentmesh.agent.loop import context
from agentmesh.agent.loop.ports import MemoryHit
from agentmesh.agent.settings import AgentSettings
from agentmesh.agent.types import ChatMessage, ToolCall, ToolSpec
from agentmesh.config import ConfigError


def call(cid: str) -> ToolCall:
    return ToolCall(cid, "shell", "{}")


def test_clip_keeps_head_and_tail():
    text = "HEAD" + "x" * 10_000 + "TAIL"
    clipped = context.clip(text, 300)
    assert clipped.startswith("HEAD") and clipped.endswith("TAIL") and "characters cut" in clipped
    assert len(clipped) < 400
    assert context.clip("short", 300) == "short"


def test_repair_orders_results_fills_gaps_and_drops_orphans():
    history = [
        ChatMessage("tool", "orphan", tool_call_id="zz"),
        ChatMessage("user", "q"),
        ChatMessage("assistant", "", tool_calls=(call("a"), call("b"), call("c"))),
        ChatMessage("tool", "result c", tool_call_id="c"),
        ChatMessage("tool", "result a", tool_call_id="a"),
        ChatMessage("assistant", "answer"),
    ]
    repaired = context.repair(history)
    assert [(m.role, m.tool_call_id) for m in repaired] == [
        ("user", ""), ("assistant", ""), ("tool", "a"), ("tool", "b"), ("tool", "c"), ("assistant", "")]
    assert repaired[3].content == context.INTERRUPTED and repaired[2].content == "result a"


def test_fit_blanks_old_outputs_of_the_current_turn_but_keeps_the_latest_round():
    current = [
        ChatMessage("user", "go"),
        ChatMessage("assistant", "", tool_calls=(call("1"),)),
        ChatMessage("tool", "A" * 3000, tool_call_id="1"),
        ChatMessage("assistant", "", tool_calls=(call("2"),)),
        ChatMessage("tool", "B" * 3000, tool_call_id="2"),
    ]
    history = [ChatMessage("user", "old"), ChatMessage("assistant", "old answer")]
    kept, fitted, omitted = context.fit("sys", history, current, budget_chars=4000, tool_output_chars=100_000)
    assert kept == [] and omitted == 2
    assert fitted[2].content == context.OMITTED_OUTPUT
    assert fitted[4].content == "B" * 3000


def test_fit_clips_every_tool_output():
    current = [ChatMessage("user", "go"), ChatMessage("assistant", "", tool_calls=(call("1"),)),
               ChatMessage("tool", "x" * 5000, tool_call_id="1")]
    _, fitted, omitted = context.fit("sys", [], current, budget_chars=100_000, tool_output_chars=500)
    assert omitted == 0 and len(fitted[2].content) < 600


def test_system_prompt_carries_date_tools_and_memories():
    now = dt.datetime(2026, 1, 2, 3, 4, tzinfo=dt.UTC)
    text = context.system_prompt(
        "Be useful.", now=now, tools=[ToolSpec("shell", "", {}), ToolSpec("memory_save", "", {})],
        memories=[MemoryHit("m1", "Bob likes tea", "preference", 0.9)], omitted=4,
    )
    assert text.startswith("Be useful.")
    assert "Friday, 02 January 2026" in text and "03:04 UTC" in text
    assert "shell, memory_save" in text and "memory_search" in text
    assert "- [preference] Bob likes tea" in text
    assert "4 earlier messages" in text
    bare = context.system_prompt("Be useful.", now=now, tools=[], memories=[])
    assert "tools" not in bare and "memory" not in bare


def test_settings_from_env():
    s = AgentSettings.from_env({"AGENTMESH_AGENT_MAX_ITERATIONS": "3", "AGENTMESH_AGENT_RECALL_K": "0",
                                "AGENTMESH_AGENT_SYSTEM_PROMPT": "Be terse."})
    assert (s.max_iterations, s.recall_k, s.system_prompt) == (3, 0, "Be terse.")
    assert AgentSettings.from_env({}) == AgentSettings()
    with pytest.raises(ConfigError, match="AGENTMESH_AGENT_MAX_ITERATIONS must be at least 1"):
        AgentSettings.from_env({"AGENTMESH_AGENT_MAX_ITERATIONS": "0"})
    with pytest.raises(ConfigError, match="AGENTMESH_AGENT_TOOL_CONCURRENCY must be a whole number"):
        AgentSettings.from_env({"AGENTMESH_AGENT_TOOL_CONCURRENCY": "many"})
