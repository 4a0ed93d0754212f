"""Teams end to end (docs/teams.md) over real gRPC with the scripted model: a lead spawns two
teammates, who run as runs of their own through the gateway, claim distinct tasks of the shared
board, exchange messages, go through the plan protocol (the lead rejects a plan, then approves
its revision) and the shutdown protocol, and the lead's answer cites both results. The
transcripts, the board and the mailboxes hold every step.

The model is one scripted server for the three agents; each request is answered by the script
of the agent it comes from (told by its system prompt), from what its conversation holds so far.
"""

from __future__ import annotations

import json
import re

import grpc
import httpx

from agentmesh.internal.v1 import memory_service_pb2 as mpb
from agentmesh.v1 import common_pb2, gateway_pb2
from tests.e2e.conftest import chat, rpc_error, transcript
from tests.e2e.teams_support import WAITING_TEAM_ENV, agent_of, seen_by, team_fixtures, tool_calls_of
from tests.e2e.test_runs import cli
from tests.support.llm_server import reply, tool_call

LEAD = "team-lead-1"
MATES = ("alice", "bob")


# Every request, of whichever agent, goes through the router (below).
llm, stack = team_fixtures(lambda: route, WAITING_TEAM_ENV)


def lead_step(messages):
    calls, seen = tool_calls_of(messages), seen_by(messages)
    names = [n for n, _ in calls]
    if not calls:
        return reply("Planning.", tool_call("task_create", {"subject": "parse"}),
                     tool_call("task_create", {"subject": "print"}),
                     tool_call("task_create", {"subject": "test", "blocked_by": [1, 2]}))
    if "spawn_teammate" not in names:
        return reply("", tool_call("spawn_teammate", {"name": "alice", "role": "parser author", "task": "Take a task."}),
                     tool_call("spawn_teammate", {"name": "bob", "role": "printer author", "task": "Take a task."}))
    reviewed = [a["request_id"] for n, a in calls if n == "plan_review"]
    for request_id in re.findall(r"\[plan request (plan-\w+)\]", seen):
        if request_id not in reviewed:
            approve = bool(reviewed)  # the first plan is rejected, its revision approved
            return reply("", tool_call("plan_review", {"request_id": request_id, "approve": approve,
                                                       "note": "" if approve else "handle errors too"}))
    results = re.findall(r"RESULT-\w+: [^\n]*", seen)
    finished = set(re.findall(r"finished #(\d)", seen))
    if len(results) < 2 or finished != {"1", "2", "3"}:
        return reply("", tool_call("read_inbox", {"wait_s": 120}))
    if "shutdown_request" not in names:
        return reply("", tool_call("shutdown_request", {"name": "alice"}), tool_call("shutdown_request", {"name": "bob"}))
    if len(re.findall(r"\[shutdown sd-\w+ approved\]", seen)) < 2:
        return reply("", tool_call("read_inbox", {"wait_s": 120}))
    return reply("The team is done. " + " ".join(sorted(results)))


def _claim_loop(name: str, messages, calls, seen):
    """Finish what was claimed, report it, and claim again until nothing is free."""
    done = {a["id"] for n, a in calls if n == "task_update" and a.get("status") == "done"}
    reported = {a["text"] for n, a in calls if n == "send_message" and a["to"] == "lead"}
    for task_id in map(int, re.findall(rf"Claimed \[~\] #(\d+) \w+ @{name}", seen)):
        if task_id not in done:
            return reply("", tool_call("task_update", {"id": task_id, "status": "done"}))
        if f"finished #{task_id}" not in reported:
            return reply("", tool_call("send_message", {"to": "lead", "text": f"finished #{task_id}"}))
    return None


def mate_step(name: str):
    def step(messages):
        calls, seen = tool_calls_of(messages), seen_by(messages)
        names = [n for n, _ in calls]
        texts = [a.get("text", "") for n, a in calls if n == "send_message"]
        if "task_claim" not in names:
            return reply("", tool_call("task_claim", {}))
        if name == "alice":
            plans = [a for n, a in calls if n == "submit_plan"]
            if not plans:
                return reply("", tool_call("submit_plan", {"plan": "v1: parse with a regex"}))
            if "rejected]" not in seen:
                return reply("Waiting for the lead's review.")
            if len(plans) == 1:
                return reply("", tool_call("submit_plan", {"plan": "v2: a regex, and errors reported"}))
            if not re.search(r"\[plan plan-\w+ approved\]", seen):
                return reply("Waiting for the lead's review.")
        if (pending := _claim_loop(name, messages, calls, seen)) is not None:
            return pending
        other = "bob" if name == "alice" else "alice"
        if not any(t.startswith(f"hello {other}") for t in texts):
            return reply("", tool_call("send_message", {"to": other, "text": f"hello {other}, {name} here"}))
        if not any(t.startswith("RESULT-") for t in texts):
            return reply("", tool_call("send_message", {"to": "lead", "text": f"RESULT-{name.upper()}: {name}'s part works"}))
        request = re.search(r"\[shutdown request (sd-\w+)\]", seen)
        if request and "shutdown_response" not in names:
            return reply("", tool_call("shutdown_response", {"request_id": request.group(1), "approve": True,
                                                             "note": "all done"}))
        if "shutdown_response" in names:
            return reply("Stopping.")
        last = messages[-1]
        if last["role"] == "tool" and "no pending task is free" in str(last.get("content")):
            return reply("Nothing left for me.")
        return reply("", tool_call("task_claim", {}))
    return step


def route(request):
    messages = request.messages
    who = agent_of(messages, MATES)
    return lead_step(messages) if who == "lead" else mate_step(who)(messages)


async def records(stack, kind: str) -> dict[str, dict]:
    reply_ = await stack.memory_stub().ListTeamRecords(
        mpb.ListTeamRecordsRequest(namespace="default", team=LEAD, kind=kind), timeout=10)
    return {r.key: json.loads(r.body_json) for r in reply_.records}


async def test_a_lead_and_two_teammates_share_a_board_talk_and_follow_both_protocols(stack, llm):
    gateway = stack.gateway_stub()

    events = await chat(gateway, LEAD, "Build the parser, the printer and the tests as a team.", max_iterations=40,
                        tools=common_pb2.ToolPolicy(deny=["shell"]))

    finished = [e for e in events if e.WhichOneof("payload") == "run_finished"]
    assert finished and "RESULT-ALICE: alice's part works" in finished[-1].run_finished.final_text
    assert "RESULT-BOB: bob's part works" in finished[-1].run_finished.final_text
    # The lead's stream showed each teammate's changes of state, with what it spent.
    shown = [e.teammate_status for e in events if e.WhichOneof("payload") == "teammate_status"]
    for name in ("alice", "bob"):
        states = [m.state for m in shown if m.name == name]
        assert states[0] in ("starting", "started") and {"working", "idle"} & set(states), (name, states)
        assert max(m.usage.total_tokens for m in shown if m.name == name) > 0
        assert {m.session_id for m in shown if m.name == name} == {f"{LEAD}.mate-{name}"}

    # The board: every task done, the three owned by the two teammates, each by one.
    board = (await records(stack, "board"))["board"]
    tasks = json.loads(board["board"])["tasks"]
    assert [t["status"] for t in tasks] == ["done", "done", "done"]
    owners = {t["id"]: t["owner"] for t in tasks}
    assert set(owners.values()) <= {"alice", "bob"} and {owners[1], owners[2]} == {"alice", "bob"}

    # The teammates: both finished after approving the shutdown, with their tokens counted.
    mates = await records(stack, "mate")
    assert set(mates) == {"alice", "bob"}
    for mate in mates.values():
        assert mate["state"] == "finished" and mate["input_tokens"] > 0
        assert mate["session_id"] == f"{LEAD}.mate-{mate['name']}"

    # The protocols: alice's first plan rejected with its note, the second approved; both shutdowns approved.
    protocols = list((await records(stack, "protocol")).values())
    plans = sorted((p for p in protocols if p["type"] == "plan"), key=lambda p: p["created_at"])
    assert [(p["from"], p["state"]) for p in plans] == [("alice", "rejected"), ("alice", "approved")]
    assert plans[0]["note"] == "handle errors too"
    shutdowns = [p for p in protocols if p["type"] == "shutdown"]
    assert sorted((p["to"], p["state"]) for p in shutdowns) == [("alice", "approved"), ("bob", "approved")]

    # The mailboxes hold every message, and each teammate's transcript got each of its mail once.
    mail = await records(stack, "mail")
    bob_box = [m["text"] for m in mail["bob"]["messages"]]
    assert "hello bob, alice here" in bob_box
    assert "hello alice, bob here" in [m["text"] for m in mail["alice"]["messages"]]
    for name in ("alice", "bob"):
        stored = await transcript(gateway, f"{LEAD}.mate-{name}")
        delivered = [int(n) for m in stored for n in re.findall(r"^\[mail (\d+) from ", m.content, re.M)]
        assert sorted(delivered) == list(range(1, mail[name]["next"])), name
    lead_transcript = await transcript(gateway, LEAD)
    delivered = [int(n) for m in lead_transcript for n in re.findall(r"^\[mail (\d+) from ", m.content, re.M)]
    assert sorted(delivered) == sorted(set(delivered))  # none twice
    assert any("[alice finished" in m["text"] for m in mail["lead"]["messages"])

    # The lead's tools are the teammates' ceiling (its turn denied shell), and they spawn no one.
    offered = {}
    for request in llm.requests:
        names = {t["function"]["name"] for t in request.body.get("tools") or []}
        offered.setdefault(agent_of(request.messages, MATES), set()).update(names)
    assert "spawn_teammate" in offered["lead"] and "read_file" in offered["lead"] and "shell" not in offered["lead"]
    for name in ("alice", "bob"):
        assert {"task_claim", "send_message", "submit_plan", "read_file"} <= offered[name]
        assert not {"shell", "spawn_teammate", "plan_review"} & offered[name]

    # Seen and controlled: the team over gRPC, HTTP and the command line; a person's message.
    team = await gateway.GetTeam(gateway_pb2.GetTeamRequest(session_id=LEAD), timeout=10)
    assert sorted((m.name, m.state) for m in team.teammates) == [("alice", "finished"), ("bob", "finished")]
    assert [t.status for t in team.tasks] == ["done", "done", "done"]
    sent = await gateway.SendTeamMessage(gateway_pb2.SendTeamMessageRequest(session_id=LEAD, to="alice",
                                                                           text="thanks"), timeout=10)
    assert (await records(stack, "mail"))["alice"]["messages"][-1]["text"] == "thanks"
    assert sent.seq == mail["alice"]["next"]
    error = await rpc_error(gateway.SendTeamMessage(gateway_pb2.SendTeamMessageRequest(
        session_id=LEAD, to="carol", text="hi"), timeout=10))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "no teammate 'carol'" in error.details()
    stopped = await gateway.StopTeammates(gateway_pb2.StopTeammatesRequest(session_id=LEAD), timeout=10)
    assert list(stopped.stopped) == []  # both had ended
    async with httpx.AsyncClient(base_url=stack.http_url, timeout=30) as client:
        shown = (await client.get(f"/v1/sessions/{LEAD}/team")).json()
    assert sorted(m["name"] for m in shown["teammates"]) == ["alice", "bob"]
    code, out, err = await cli(stack, "team", LEAD)
    assert code == 0, err
    assert re.search(r"^alice\s+finished\s+\d+ tokens", out, re.M) and "#3 test @" in out

    # One trace: each teammate's run is part of the lead's.
    lead_trace = finished[-1].run_finished.trace_id
    for mate in mates.values():
        run = await gateway.GetRun(gateway_pb2.GetRunRequest(run_id=mate["run_id"]), timeout=10)
        assert run.trace_id == lead_trace, mate["name"]
