"""Two agent replicas as real processes behind one gateway (round-robin over both, as behind a
headless Service), and the one running a teammate killed with SIGKILL in the middle of its turn
(its model call held open): the lead starts the teammate again on the surviving replica, from
its transcript and mailbox, and the team finishes, each message having reached the teammate's
model once (docs/teams.md, "Resilience").

Whichever replica the lead's own turn landed on: if it was the killed one, the lead's turn ends
with it, and the person's next message to the lead carries on (its next turn restarts the
teammate) — the team outlives both runs.
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

from agentmesh.cli.stack import child_environment, free_address
from agentmesh.config import SERVICES
from agentmesh.rpc.client import open_channel
from agentmesh.v1 import gateway_pb2, gateway_pb2_grpc
from tests.e2e.conftest import collect
from tests.e2e.teams_support import agent_of, seen_by, tool_calls_of
from tests.e2e.test_faults import process_env
from tests.support.llm_server import ScriptedLLMServer, reply, tool_call
from tests.support.turns import wait_until

pytestmark = pytest.mark.slow

LEAD = "team-replicas-1"


def pid_of_peer(peer: str) -> int:
    """The process holding the client end `peer` (host:port) of an open connection."""
    port = peer.rsplit(":", 1)[1]
    out = subprocess.run(["ss", "-tnpH", f"( sport = :{port} )"], capture_output=True, text=True, check=True).stdout
    found = re.search(r"pid=(\d+)", out)
    assert found, out
    return int(found.group(1))


class Script:
    """The lead and alice, each from what its conversation holds; alice's model call after her
    first mail is held open once (`hold`), for the test to kill her replica during it."""

    def __init__(self):
        self.hold = threading.Event()
        self.held = False
        # Each model call's agent process (found while its connection is open), per agent.
        self.pids: dict[str, list[int]] = {"lead": [], "alice": []}
        self.victim = 0  # the process of alice's held call

    def __call__(self, request):
        messages = request.messages
        self.pids[agent_of(messages)].append(pid_of_peer(request.peer))
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
            self.victim = self.pids["alice"][-1]
            self.held = True
            return reply("", tool_call("task_claim", {}), pause_after_chunks=1, hold=self.hold)
        if "send_message" not in names:
            return reply("", tool_call("send_message", {"to": "lead", "text": "RESULT-ALICE: parsed after a restart"}))
        return reply("Done.")


@pytest.fixture
def script():
    return Script()


@pytest.fixture
def llm(script):
    with ScriptedLLMServer(default=script) as server:
        yield server


class TwoAgents:
    """memory, tools, scheduler and gateway, and two agent replicas, each its own process."""

    def __init__(self, tmp_path, llm):
        env = process_env(tmp_path / "home", llm.base_url, {
            "AGENTMESH_AGENT_TEAM_IDLE_S": "1", "AGENTMESH_AGENT_TEAM_INBOX_WAIT_S": "120",
            "AGENTMESH_AGENT_TEAM_CHECK_S": "0.5", "AGENTMESH_GATEWAY_HTTP_ADDR": "off"})
        self.agents = [env["AGENTMESH_AGENT_ADDR"], free_address()]
        self.env = {**env, "AGENTMESH_AGENT_ADDR": "ipv4:" + ",".join(self.agents)}
        self.logs = tmp_path / "logs"
        self.logs.mkdir()
        self.children: dict[str, subprocess.Popen] = {}

    def _spawn(self, key: str, name: str, env) -> None:
        with open(self.logs / f"{key}.log", "ab") as out:
            self.children[key] = subprocess.Popen(
                [sys.executable, "-m", "agentmesh.cli.main", "serve", name, "--parent-pid", str(os.getpid())],
                env=child_environment(env), stdout=out, stderr=out, start_new_session=True)

    async def __aenter__(self) -> "TwoAgents":
        for name in SERVICES:
            if name != "agent":
                self._spawn(name, name, self.env)
        for index, address in enumerate(self.agents):
            self._spawn(f"agent{index}", "agent", {**self.env, "AGENTMESH_AGENT_ADDR": address})
        self.gateway_channel = open_channel(self.env["AGENTMESH_GATEWAY_ADDR"], wait_for_peer_s=60)
        self.gateway = gateway_pb2_grpc.GatewayStub(self.gateway_channel)
        for address in self.agents:
            async with open_channel(address, wait_for_peer_s=60) as channel:
                await channel.channel_ready()
        await self.gateway_channel.channel_ready()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.gateway_channel.close()
        for child in self.children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in self.children.values():
            try:
                await asyncio.to_thread(child.wait, 30)
            except subprocess.TimeoutExpired:
                child.kill()

    def key_of(self, pid: int) -> str:
        return next(k for k, c in self.children.items() if c.pid == pid)

    async def chat(self, message: str) -> list:
        request = gateway_pb2.ChatRequest(session_id=LEAD, message=message,
                                          options=gateway_pb2.ChatOptions(max_iterations=30))
        try:
            return await collect(self.gateway.Chat(request, timeout=300))
        except grpc.aio.AioRpcError:
            return []


def _final(events) -> str:
    done = [e for e in events if e.WhichOneof("payload") == "run_finished"]
    return done[-1].run_finished.final_text if done else ""


async def test_killing_the_replica_that_runs_a_teammate_mid_turn_resumes_it_on_the_other(tmp_path, llm, script):
    async with TwoAgents(tmp_path, llm) as stack:
        lead_turn = asyncio.ensure_future(stack.chat("Parse it with a teammate."))
        # alice's model call after her first mail, held open: she is mid-turn.
        await wait_until(lambda: script.held, timeout=120)
        victim, calls_before = script.victim, len(script.pids["alice"])
        killed = stack.key_of(victim)
        os.kill(victim, signal.SIGKILL)
        await asyncio.to_thread(stack.children[killed].wait)
        script.hold.set()  # frees the server's thread; nobody reads the answer

        events = await lead_turn
        if "RESULT-ALICE" not in _final(events):
            # The lead's turn ran on the killed replica too, or ended before her restarted run
            # reported (its step budget, a loaded machine): the lead's next turn carries on.
            events = await stack.chat("Carry on.")
        assert "RESULT-ALICE: parsed after a restart" in _final(events)

        team = await stack.gateway.GetTeam(gateway_pb2.GetTeamRequest(session_id=LEAD), timeout=10)
        assert [m.name for m in team.teammates] == ["alice"]
        # Her second run ran on the surviving replica.
        after = script.pids["alice"][calls_before:]
        assert after and victim not in after
        # Her one mail reached her model once in each of her model calls, and her transcript once.
        for request in llm.requests:
            if agent_of(request.messages) == "alice":
                marks = re.findall(r"^\[mail (\d+) from ", seen_by(request.messages), re.M)
                assert len(marks) == len(set(marks)), marks
        runs = (await stack.gateway.ListRuns(gateway_pb2.ListTurnRunsRequest(session_id=f"{LEAD}.mate-alice"),
                                             timeout=10)).runs
        assert "failed" in [r.state for r in runs] and len(runs) == 2
