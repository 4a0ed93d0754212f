"""The gateway killed (SIGKILL) in the middle of a teammate's turn, and started again: the team
does not end (docs/teams.md, "Resilience"). The teammate's turn, cancelled under it on the agent,
watches its run; the restarted gateway finds the run's record unrefreshed past its lease,
records it `interrupted` (GATEWAY_LOST) and starts the teammate again — with no lead turn
running, since the lead's turn ended with the gateway too. The teammate carries on from its
transcript and mailbox, reports, and finishes; each message reached its model once; the lead's
next turn reads the report.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading

import grpc
import pytest

from agentmesh.cli.stack import child_environment
from agentmesh.config import SERVICES
from agentmesh.rpc.client import open_channel
from agentmesh.v1 import gateway_pb2, gateway_pb2_grpc
from tests.e2e.conftest import collect
from tests.e2e.teams_support import agent_of, seen_by, tool_calls_of
from tests.e2e.test_faults import process_env
from tests.support.llm_server import ScriptedLLMServer, reply, tool_call
from tests.support.turns import wait_until

pytestmark = pytest.mark.slow

LEAD = "team-gateway-restart-1"


class Script:
    """The lead and alice; alice's model call after her first mail is held open once, for the
    test to kill the gateway during it."""

    def __init__(self):
        self.hold = threading.Event()
        self.held = False

    def __call__(self, request):
        messages = request.messages
        calls, seen = tool_calls_of(messages), seen_by(messages)
        names = [n for n, _ in calls]
        if agent_of(messages) == "lead":
            if "spawn_teammate" not in names:
                return reply("", tool_call("task_create", {"subject": "parse"}),
                             tool_call("spawn_teammate", {"name": "alice", "role": "parser author", "task": "Wait for mail."}))
            if "send_message" not in names:
                return reply("", tool_call("send_message", {"to": "alice", "text": "first: parse it"}))
            if "RESULT-ALICE" not in seen:
                return reply("", tool_call("read_inbox", {"wait_s": 120}))
            return reply("Done: " + re.search(r"RESULT-ALICE[^\n]*", seen).group(0))
        if "[mail 1 from lead]" not in seen:
            return reply("", tool_call("read_inbox", {"wait_s": 120}))
        if not self.held:
            self.held = True
            return reply("", tool_call("task_claim", {}), pause_after_chunks=1, hold=self.hold)
        if "send_message" not in names:
            return reply("", tool_call("send_message", {"to": "lead", "text": "RESULT-ALICE: parsed after a gateway restart"}))
        return reply("Done.")


@pytest.fixture
def script():
    return Script()


@pytest.fixture
def llm(script):
    with ScriptedLLMServer(default=script) as server:
        yield server


class Services:
    """Every service a process of its own, so the gateway can be killed and started again."""

    def __init__(self, tmp_path, llm):
        self.env = process_env(tmp_path / "home", llm.base_url, {
            "AGENTMESH_AGENT_TEAM_IDLE_S": "1", "AGENTMESH_AGENT_TEAM_INBOX_WAIT_S": "120",
            "AGENTMESH_AGENT_TEAM_CHECK_S": "0.5", "AGENTMESH_GATEWAY_HTTP_ADDR": "off",
            "AGENTMESH_GATEWAY_RUN_LEASE_S": "3"})
        self.logs = tmp_path / "logs"
        self.logs.mkdir()
        self.children: dict[str, subprocess.Popen] = {}

    def spawn(self, name: str) -> None:
        with open(self.logs / f"{name}.log", "ab") as out:
            self.children[name] = subprocess.Popen(
                [sys.executable, "-m", "agentmesh.cli.main", "serve", name, "--parent-pid", str(os.getpid())],
                env=child_environment(self.env), stdout=out, stderr=out, start_new_session=True)

    async def connect(self) -> None:
        self.channel = open_channel(self.env["AGENTMESH_GATEWAY_ADDR"], wait_for_peer_s=60)
        self.gateway = gateway_pb2_grpc.GatewayStub(self.channel)
        await self.channel.channel_ready()

    async def __aenter__(self) -> "Services":
        for name in SERVICES:
            self.spawn(name)
        async with open_channel(self.env["AGENTMESH_AGENT_ADDR"], wait_for_peer_s=60) as channel:
            await channel.channel_ready()
        await self.connect()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.channel.close()
        for child in self.children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in self.children.values():
            try:
                await asyncio.to_thread(child.wait, 30)
            except subprocess.TimeoutExpired:
                child.kill()

    async def restart_gateway(self) -> None:
        await self.channel.close()
        self.spawn("gateway")
        await self.connect()

    async def chat(self, message: str) -> list:
        request = gateway_pb2.ChatRequest(session_id=LEAD, message=message,
                                          options=gateway_pb2.ChatOptions(max_iterations=30))
        try:
            return await collect(self.gateway.Chat(request, timeout=300))
        except grpc.aio.AioRpcError:
            return []

    async def alice(self):
        team = await self.gateway.GetTeam(gateway_pb2.GetTeamRequest(session_id=LEAD), timeout=10)
        return next(m for m in team.teammates if m.name == "alice")


async def _until(check, timeout: float = 180) -> None:
    """Wait, asking `check` (async) a few times a second, until it is true."""
    async def loop():
        while not await check():
            await asyncio.sleep(0.2)
    await asyncio.wait_for(loop(), timeout)


async def test_a_gateway_killed_mid_teammate_turn_and_restarted_does_not_end_the_team(tmp_path, llm, script):
    async with Services(tmp_path, llm) as stack:
        lead_turn = asyncio.ensure_future(stack.chat("Parse it with a teammate."))
        # alice's model call after her first mail, held open: she is mid-turn.
        await wait_until(lambda: script.held, timeout=120)
        stack.children["gateway"].send_signal(signal.SIGKILL)
        await asyncio.to_thread(stack.children["gateway"].wait)
        # The held call stays held (its server thread freed at the end): her turn ends only by
        # the agent seeing its gateway gone, never by an answer that raced the kill.
        await lead_turn  # its stream broke with the gateway
        await stack.restart_gateway()

        # No lead turn runs now: alice is started again from where her run's end is seen, and
        # finishes, her report in the lead's inbox.
        async def alice_finished():
            return (await stack.alice()).state == "finished"
        await _until(alice_finished)
        assert (await stack.alice()).last_message == "Done."

        runs = (await stack.gateway.ListRuns(gateway_pb2.ListTurnRunsRequest(session_id=f"{LEAD}.mate-alice"),
                                             timeout=10)).runs
        assert sorted(r.state for r in runs) == ["interrupted", "succeeded"]
        lost = next(r for r in runs if r.state == "interrupted")
        assert lost.error_reason == "GATEWAY_LOST"

        # Her mail reached her model once in each of her model calls.
        for request in llm.requests:
            if agent_of(request.messages) == "alice":
                marks = re.findall(r"^\[mail (\d+) from ", seen_by(request.messages), re.M)
                assert len(marks) == len(set(marks)), marks

        events = await stack.chat("Carry on.")
        done = [e for e in events if e.WhichOneof("payload") == "run_finished"]
        assert done and "RESULT-ALICE: parsed after a gateway restart" in done[-1].run_finished.final_text
        script.hold.set()
