"""A team's limits (docs/teams.md): a spawn past the namespace's cap on unfinished teammates is
refused with a sentence the lead's model reads, and starts nothing."""

from __future__ import annotations

import json

from agentmesh.internal.v1 import memory_service_pb2 as mpb
from tests.e2e.conftest import chat
from tests.e2e.teams_support import team_fixtures
from tests.support.llm_server import reply, tool_call


def route(request):
    system = str(request.messages[0].get("content") or "")
    if "a teammate with the role" in system:
        return reply("Nothing to do.")
    if not any(m["role"] == "tool" for m in request.messages):
        return reply("", tool_call("spawn_teammate", {"name": "ann", "role": "r", "task": "t"}),
                     tool_call("spawn_teammate", {"name": "ben", "role": "r", "task": "t"}))
    return reply("Done.")


llm, stack = team_fixtures(lambda: route, {"AGENTMESH_AGENT_TEAM_MAX_PER_NAMESPACE": "1", "AGENTMESH_AGENT_TEAM_IDLE_S": "0"})


async def test_a_spawn_past_the_namespaces_cap_is_refused_and_starts_nothing(stack):
    events = await chat(stack.gateway_stub(), "capped", "Two teammates, please.")
    results = [e.tool_result.result for e in events if e.WhichOneof("payload") == "tool_result"]
    assert [r.is_error for r in results] == [False, True]
    assert results[1].error_kind == "team_refused"
    assert "already runs 1 teammates, its limit (AGENTMESH_AGENT_TEAM_MAX_PER_NAMESPACE)" in results[1].output
    listed = await stack.memory_stub().ListTeamRecords(
        mpb.ListTeamRecordsRequest(namespace="default", team="capped", kind="mate"), timeout=10)
    assert [r.key for r in listed.records] == ["ann"]
    assert json.loads(listed.records[0].body_json)["session_id"] == "capped.mate-ann"
