"""A teammate's run that ends while no lead turn runs is dealt with where its end is seen — the
gateway that relayed it (docs/teams.md, "Resilience") — not at the lead's next turn: a failed
run is started again in the teammate's session, a stopped (cancelled) one finishes the teammate
and tells the lead.
"""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from agentmesh.internal.v1 import memory_service_pb2 as mpb
from agentmesh.v1 import gateway_pb2
from tests.e2e.conftest import chat
from tests.e2e.teams_support import agent_of, seen_by, tool_calls_of
from tests.support.llm_server import ScriptedLLMServer, failure, reply, tool_call
from tests.support.stack import Stack

LEAD = "team-no-lead-1"


class Script:
    """The lead spawns alice and ends its turn. alice's first model call waits (`go`) until the
    test has seen the lead's turn end; then, with `fail`, it fails (HTTP 400) once, else she
    waits for mail."""

    def __init__(self):
        self.go = threading.Event()
        self.fail = False
        self.failed = False
        self.long_wait = threading.Event()  # alice was told to wait for mail (her first call or her second)

    def __call__(self, request):
        messages = request.messages
        names = [n for n, _ in tool_calls_of(messages)]
        if agent_of(messages) == "lead":
            if "spawn_teammate" not in names:
                return reply("", tool_call("spawn_teammate", {"name": "alice", "role": "parser author",
                                                              "task": "Report to the lead."}))
            return reply("alice is on it.")
        if not self.go.is_set():
            return reply("", tool_call("read_inbox", {}), pause_after_chunks=1, hold=self.go)
        if self.fail and not self.failed:
            self.failed = True
            return failure(400, message="the model went away")
        if self.fail:
            if "send_message" not in names:
                return reply("", tool_call("send_message", {"to": "lead", "text": "RESULT-ALICE after a restart"}))
            return reply("Done.")
        self.long_wait.set()
        return reply("", tool_call("read_inbox", {"wait_s": 120}))


@pytest.fixture
def script():
    return Script()


@pytest.fixture
def llm(script):
    with ScriptedLLMServer(default=script) as server:
        yield server


@pytest.fixture
async def stack(tmp_path, llm):
    env = {"AGENTMESH_AGENT_TEAM_IDLE_S": "1", "AGENTMESH_AGENT_TEAM_INBOX_WAIT_S": "120"}
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=env) as running:
        yield running


async def _team(gateway) -> dict:
    team = await gateway.GetTeam(gateway_pb2.GetTeamRequest(session_id=LEAD), timeout=10)
    return {m.name: m for m in team.teammates}


async def _until(check, timeout: float = 120) -> None:
    async def loop():
        while not await check():
            await asyncio.sleep(0.1)
    await asyncio.wait_for(loop(), timeout)


async def _lead_mail(stack) -> list[str]:
    reply_ = await stack.memory_stub().ListTeamRecords(
        mpb.ListTeamRecordsRequest(namespace="default", team=LEAD, kind="mail"), timeout=10)
    boxes = {r.key: json.loads(r.body_json) for r in reply_.records}
    return [m["text"] for m in boxes.get("lead", {}).get("messages", [])]


async def _runs(gateway):
    return (await gateway.ListRuns(gateway_pb2.ListTurnRunsRequest(session_id=f"{LEAD}.mate-alice"),
                                   timeout=10)).runs


async def test_a_teammate_failing_while_no_lead_turn_runs_is_started_again_at_once(stack, llm, script):
    gateway = stack.gateway_stub()
    script.fail = True
    events = await chat(gateway, LEAD, "Get alice going.", max_iterations=10)
    assert events[-1].WhichOneof("payload") == "run_finished"
    script.go.set()  # the lead's turn has ended: alice's run fails now

    async def finished():
        return (await _team(gateway))["alice"].state == "finished"
    await _until(finished)
    assert sorted(r.state for r in await _runs(gateway)) == ["failed", "succeeded"]
    assert "RESULT-ALICE after a restart" in await _lead_mail(stack)
    # Her restarted run was told why, and nobody talked to the lead meanwhile.
    resumed = [r for r in llm.requests if agent_of(r.messages) == "alice" and "previous run ended" in seen_by(r.messages)]
    assert resumed
    assert len([r for r in llm.requests if agent_of(r.messages) == "lead"]) == 2


async def test_a_teammate_stopped_while_no_lead_turn_runs_finishes_and_the_lead_is_told(stack, llm, script):
    gateway = stack.gateway_stub()
    await chat(gateway, LEAD, "Get alice going.", max_iterations=10)
    script.go.set()

    async def waiting():
        # She was told to read her inbox with a long wait: by her second call, or by her first when
        # it reached the model only after the lead's turn had ended (a loaded machine).
        return script.long_wait.is_set()
    await _until(waiting)
    stopped = await gateway.StopTeammates(gateway_pb2.StopTeammatesRequest(session_id=LEAD), timeout=10)
    assert list(stopped.stopped) == ["alice"]

    async def finished():
        return (await _team(gateway))["alice"].state == "finished"
    await _until(finished)
    assert [r.state for r in await _runs(gateway)] == ["cancelled"]
    assert any(text.startswith("[alice finished (cancelled)]") for text in await _lead_mail(stack))
