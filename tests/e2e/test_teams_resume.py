"""A teammate whose run ends with an error mid-turn — as when its agent replica dies — is started
again by the lead in its own session (docs/teams.md, "Resilience"): it carries on from its
transcript and mailbox, the mail that reached its model before the failure is not delivered
again, the mail that came meanwhile is, and the team finishes.

The failure here is the model's (an HTTP 400 answer ends alice's first run mid-turn, after a
message reached her); the gateway records the run as failed exactly as it does a run whose agent
replica was killed (its relay broken), and the lead reads only that record.
"""

from __future__ import annotations

import asyncio
import json
import re

from agentmesh.gateway.runs import TERMINAL_STATES
from agentmesh.internal.v1 import memory_service_pb2 as mpb
from agentmesh.v1 import gateway_pb2
from tests.e2e.conftest import chat, transcript
from tests.e2e.teams_support import agent_of, seen_by, team_fixtures, tool_calls_of
from tests.support.llm_server import failure, reply, tool_call

LEAD = "team-resume-1"


class Script:
    def __init__(self):
        self.failed = False

    def __call__(self, request):
        messages = request.messages
        calls, seen = tool_calls_of(messages), seen_by(messages)
        names = [n for n, _ in calls]
        if agent_of(messages) == "lead":
            if not calls:
                return reply("", tool_call("task_create", {"subject": "parse"}),
                             tool_call("spawn_teammate", {"name": "alice", "role": "parser author", "task": "Wait for mail."}))
            if "send_message" not in names:
                return reply("", tool_call("send_message", {"to": "alice", "text": "first: parse it"}))
            if re.search(r"\[alice finished \((?:failed|error)\)\]", seen):
                return reply("The team failed.")
            if re.search(r"alice: restarted", seen) is None and "RESULT-ALICE" not in seen:
                return reply("", tool_call("read_inbox", {"wait_s": 120}))
            if "second" not in " ".join(a.get("text", "") for n, a in calls if n == "send_message"):
                return reply("", tool_call("send_message", {"to": "alice", "text": "second: and test it"}))
            if "RESULT-ALICE" not in seen:
                return reply("", tool_call("read_inbox", {"wait_s": 120}))
            return reply("Done: " + re.search(r"RESULT-ALICE[^\n]*", seen).group(0))
        # alice
        if "[mail 1 from lead]" not in seen:
            return reply("", tool_call("read_inbox", {"wait_s": 120}))
        if not self.failed:
            # Her run ends here, mid-turn, with mail 1 delivered to her model.
            self.failed = True
            return failure(400, message="the model went away")
        if "send_message" not in names:
            return reply("", tool_call("send_message", {"to": "lead", "text": "alice: restarted"}))
        if "[mail 2 from lead]" not in seen:
            return reply("", tool_call("read_inbox", {"wait_s": 120}))
        if len([n for n in names if n == "send_message"]) < 2:
            return reply("", tool_call("send_message", {"to": "lead", "text": "RESULT-ALICE: parsed and tested"}))
        return reply("Stopping.")


llm, stack = team_fixtures(Script, {"AGENTMESH_AGENT_TEAM_IDLE_S": "1", "AGENTMESH_AGENT_TEAM_INBOX_WAIT_S": "120",
                                    "AGENTMESH_AGENT_TEAM_CHECK_S": "0.5"})


async def test_a_teammate_whose_run_failed_mid_turn_is_started_again_and_gets_each_mail_once(stack, llm):
    gateway = stack.gateway_stub()

    events = await chat(gateway, LEAD, "Parse it with a teammate.", max_iterations=30)

    finished = [e for e in events if e.WhichOneof("payload") == "run_finished"]
    assert finished and "RESULT-ALICE: parsed and tested" in finished[-1].run_finished.final_text

    mate = {r.key: json.loads(r.body_json) for r in (await stack.memory_stub().ListTeamRecords(
        mpb.ListTeamRecordsRequest(namespace="default", team=LEAD, kind="mate"), timeout=10)).records}["alice"]
    assert mate["restarts"] == 1
    # Two runs in her session: the failed one, and the one that carried on.
    async def runs():
        return (await gateway.ListRuns(gateway_pb2.ListTurnRunsRequest(session_id=f"{LEAD}.mate-alice"),
                                       timeout=10)).runs
    for _ in range(600):  # she ends once idle (AGENTMESH_AGENT_TEAM_IDLE_S)
        if all(r.state in TERMINAL_STATES for r in await runs()):
            break
        await asyncio.sleep(0.1)
    assert sorted(r.state for r in await runs()) == ["failed", "succeeded"]

    # Each of her mail reached her model once: in every request of hers, each mark once at most,
    # and her transcript holds both, once.
    for request in llm.requests:
        if agent_of(request.messages) != "alice":
            continue
        marks = re.findall(r"^\[mail (\d+) from ", seen_by(request.messages), re.M)
        assert len(marks) == len(set(marks)), marks
    stored = await transcript(gateway, f"{LEAD}.mate-alice")
    delivered = [int(n) for m in stored for n in re.findall(r"^\[mail (\d+) from ", m.content, re.M)]
    assert sorted(delivered) == [1, 2]
