"""A person in the lead's place (docs/teams.md): through the team API (`SendTeamMessage` with a
request id, or `shutdown`) a person rejects a teammate's plan with a note, approves its
revision, and asks it to stop; the teammate follows each answer as it follows the lead's, and
the protocol records say who answered. Bad answers are refused with nothing changed."""

from __future__ import annotations

import asyncio
import json
import re

import grpc

from agentmesh.internal.v1 import memory_service_pb2 as mpb
from agentmesh.v1 import gateway_pb2
from tests.e2e.conftest import chat, rpc_error
from tests.e2e.teams_support import WAITING_TEAM_ENV, agent_of, seen_by, team_fixtures, tool_calls_of
from tests.e2e.test_runs import cli
from tests.support.llm_server import reply, tool_call

LEAD = "team-person-1"


def route(request):
    messages = request.messages
    calls, seen = tool_calls_of(messages), seen_by(messages)
    names = [n for n, _ in calls]
    if agent_of(messages) == "lead":
        if not calls:
            return reply("", tool_call("task_create", {"subject": "parse"}),
                         tool_call("spawn_teammate", {"name": "alice", "role": "parser author", "task": "Plan it."}))
        if not re.search(r"\[shutdown sd-\w+ approved\]", seen):
            return reply("", tool_call("read_inbox", {"wait_s": 120}))
        return reply("Done: " + re.search(r"RESULT-ALICE[^\n]*", seen).group(0))
    plans = [a for n, a in calls if n == "submit_plan"]
    if not plans:
        return reply("", tool_call("submit_plan", {"plan": "v1: a regex"}))
    if "rejected]" not in seen:
        return reply("Waiting for a review.")
    if len(plans) == 1:
        return reply("", tool_call("submit_plan", {"plan": "v2: a regex, errors reported"}))
    if not re.search(r"\[plan plan-\w+ approved\]", seen):
        return reply("Waiting for a review.")
    if "send_message" not in names:
        return reply("", tool_call("send_message", {"to": "lead", "text": "RESULT-ALICE: parsed with v2"}))
    request_ = re.search(r"\[shutdown request (sd-\w+)\]", seen)
    if request_ and "shutdown_response" not in names:
        return reply("", tool_call("shutdown_response", {"request_id": request_.group(1), "approve": True}))
    return reply("Stopping." if request_ else "Waiting.")


llm, stack = team_fixtures(lambda: route, WAITING_TEAM_ENV)


async def test_a_person_answers_plans_and_asks_for_a_shutdown_in_the_leads_place(stack, llm):
    gateway, memory = stack.gateway_stub(), stack.memory_stub()
    protocols: dict[str, dict] = {}

    async def refresh() -> None:
        reply_ = await memory.ListTeamRecords(mpb.ListTeamRecordsRequest(namespace="default", team=LEAD,
                                                                         kind="protocol"), timeout=10)
        protocols.clear()
        protocols.update({r.key: json.loads(r.body_json) for r in reply_.records})

    async def pending_plan(count: int) -> str:
        for _ in range(1200):
            await refresh()
            plans = sorted((p for p in protocols.values() if p["type"] == "plan"), key=lambda p: p["created_at"])
            if len(plans) >= count and plans[count - 1]["state"] == "pending":
                return plans[count - 1]["id"]
            await asyncio.sleep(0.1)
        raise AssertionError(f"no plan request number {count}")

    lead_turn = asyncio.ensure_future(chat(gateway, LEAD, "Parse it with a teammate.", max_iterations=30))
    first = await pending_plan(1)

    # Bad answers: an unknown request, a plan that is not the named teammate's; nothing changes.
    for bad in (gateway_pb2.SendTeamMessageRequest(session_id=LEAD, to="alice", request_id="plan-nope"),
                gateway_pb2.SendTeamMessageRequest(session_id=LEAD, to="lead", request_id=first),
                gateway_pb2.SendTeamMessageRequest(session_id=LEAD, to="alice", request_id=first, shutdown=True)):
        error = await rpc_error(gateway.SendTeamMessage(bad, timeout=10))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    await refresh()
    assert protocols[first]["state"] == "pending"

    answer = await gateway.SendTeamMessage(gateway_pb2.SendTeamMessageRequest(
        session_id=LEAD, to="alice", request_id=first, approve=False, text="handle errors too"), timeout=10)
    assert (answer.request_id, answer.state) == (first, "rejected")
    again = await rpc_error(gateway.SendTeamMessage(gateway_pb2.SendTeamMessageRequest(
        session_id=LEAD, to="alice", request_id=first, approve=True), timeout=10))
    assert again.code() == grpc.StatusCode.FAILED_PRECONDITION and "answered already" in again.details()

    second = await pending_plan(2)
    code, out, err = await cli(stack, "team", LEAD, "approve", "alice", second)
    assert code == 0, err
    assert out.strip() == f"plan {second} of alice: approved"

    async def reported() -> bool:
        reply_ = await memory.ListTeamRecords(mpb.ListTeamRecordsRequest(namespace="default", team=LEAD,
                                                                         kind="mail"), timeout=10)
        boxes = {r.key: json.loads(r.body_json) for r in reply_.records}
        return any("RESULT-ALICE" in m["text"] for m in boxes.get("lead", {}).get("messages", []))

    for _ in range(1200):
        if await reported():
            break
        await asyncio.sleep(0.1)
    stop = await gateway.SendTeamMessage(gateway_pb2.SendTeamMessageRequest(
        session_id=LEAD, to="alice", shutdown=True, text="thanks, that is all"), timeout=10)
    assert stop.request_id.startswith("sd-") and stop.state == "pending"

    events = await lead_turn
    finished = [e for e in events if e.WhichOneof("payload") == "run_finished"]
    assert finished and "RESULT-ALICE: parsed with v2" in finished[-1].run_finished.final_text
    await refresh()
    assert protocols[first]["state"] == "rejected" and protocols[first]["note"] == "handle errors too"
    assert protocols[second]["state"] == "approved" and protocols[second]["by"]
    assert protocols[stop.request_id]["state"] == "approved"
    team = await gateway.GetTeam(gateway_pb2.GetTeamRequest(session_id=LEAD), timeout=10)
    assert [m.name for m in team.teammates] == ["alice"]
    # The protocol requests, oldest first, as a person sees them to answer.
    assert [(r.request_id, r.type, r.teammate, r.state) for r in team.requests] == [
        (first, "plan", "alice", "rejected"), (second, "plan", "alice", "approved"),
        (stop.request_id, "shutdown", "alice", "approved")]
    assert (team.requests[0].plan, team.requests[0].note) == ("v1: a regex", "handle errors too")
    assert team.requests[1].answered_by and not team.requests[2].answered_by
