"""An idle teammate waits (docs/teams.md): a free task on the board it has already been told of
and chose not to take wakes it once, not at every look — it then waits for mail, and the mail a
person sends it is what moves it on. (A teammate woken by the same free task at every look spent
its whole iteration budget in a second and ended before the mail came.)"""

from __future__ import annotations

import asyncio

import grpc

from agentmesh.v1 import gateway_pb2
from tests.e2e.conftest import chat
from tests.e2e.teams_support import WAITING_TEAM_ENV, agent_of, seen_by, team_fixtures, tool_calls_of
from tests.support.llm_server import reply, tool_call

LEAD = "team-idle-1"


def route(request):
    messages = request.messages
    calls, seen = tool_calls_of(messages), seen_by(messages)
    names = [n for n, _ in calls]
    if agent_of(messages) == "lead":
        if not calls:
            return reply("", tool_call("task_create", {"subject": "someone else's"}))
        if "spawn_teammate" not in names:
            return reply("", tool_call("spawn_teammate", {"name": "alice", "role": "helper", "task": "Wait for the word."}))
        if "RESULT-ALICE" not in seen:
            return reply("", tool_call("read_inbox", {"wait_s": 120}))
        return reply("Done: RESULT-ALICE")
    if "PROCEED" not in seen:
        return reply("Waiting for the word.")  # never takes the free task
    if "send_message" not in names:
        return reply("", tool_call("send_message", {"to": "lead", "text": "RESULT-ALICE"}))
    return reply("Sent.")


llm, stack = team_fixtures(lambda: route, WAITING_TEAM_ENV)


def alice_requests(llm) -> int:
    return sum(1 for r in llm.requests if agent_of(r.messages) == "alice")


async def test_a_free_task_the_teammate_leaves_wakes_it_once_and_mail_moves_it_on(stack, llm):
    gateway = stack.gateway_stub()
    lead_turn = asyncio.ensure_future(chat(gateway, LEAD, "Spawn a helper.", max_iterations=30))

    async def alice():
        try:
            team = await gateway.GetTeam(gateway_pb2.GetTeamRequest(session_id=LEAD), timeout=10)
        except grpc.aio.AioRpcError as error:  # the lead's session is not made yet
            assert error.code() == grpc.StatusCode.NOT_FOUND, error.details()
            return None
        return next((m for m in team.teammates if m.name == "alice"), None)

    # Idle, having answered at least twice: its first answer, and the one the free task woke.
    for _ in range(600):
        mate = await alice()
        if mate is not None and mate.state == "idle" and alice_requests(llm) >= 2:
            break
        assert mate is None or mate.state != "finished", f"alice ended while she should wait: {mate}"
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("alice never went idle")
    asked = alice_requests(llm)
    assert asked == 2, f"alice was woken {asked - 1} times by one free task"

    await gateway.SendTeamMessage(gateway_pb2.SendTeamMessageRequest(session_id=LEAD, to="alice", text="PROCEED"),
                                  timeout=10)
    events = await lead_turn
    finished = [e for e in events if e.WhichOneof("payload") == "run_finished"]
    assert finished and finished[-1].run_finished.final_text == "Done: RESULT-ALICE"
