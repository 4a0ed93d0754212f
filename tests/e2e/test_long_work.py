"""Long work end to end, all five services over real gRPC and a scripted model: a deep turn plans
three tasks and makes them depend on each other, starts a background command, works on another
task meanwhile, sees the background result at its next step, finishes every task; the board
survives a restart of every service; cancelling a turn kills its background command (in /proc)."""

from __future__ import annotations

import json

from agentmesh.v1 import gateway_pb2, sessions_pb2
from tests.e2e.conftest import chat, of_kind, transcript
from tests.support.llm_server import ScriptedLLMServer, reply, tool_call
from tests.support.processes import processes_running
from tests.support.stack import Stack
from tests.support.turns import LiveTurn, wait_until

PLAN = "1. fetch the data\n2. write the notes\n3. write the report"


def script(*steps):
    queue = list(steps)

    def model(request):
        last = request.messages[-1]
        if last["role"] == "system" and "numbered plan" in last["content"]:
            return reply(PLAN)
        return queue.pop(0)

    return model


STEPS = [
    reply("", tool_call("task_update", {"id": 3, "add_blocked_by": [1, 2]}),
          tool_call("task_update", {"id": 1, "status": "in_progress"}),
          tool_call("background_run", {"command": "sleep 0.3; echo 42 > data.txt; echo fetched"})),
    reply("", tool_call("task_update", {"id": 2, "status": "in_progress"}),
          tool_call("shell", {"command": "sleep 1.5; echo notes > notes.txt"})),
    reply("", tool_call("task_update", {"id": 1, "status": "done"}), tool_call("task_update", {"id": 2, "status": "done"})),
    reply("", tool_call("task_update", {"id": 3, "status": "in_progress"}), tool_call("read_file", {"path": "data.txt"})),
    reply("", tool_call("task_update", {"id": 3, "status": "done"})),
    reply("Report: the data is 42."),
]


async def test_a_deep_turn_works_through_dependent_tasks_with_a_background_command(tmp_path):
    with ScriptedLLMServer(default=script(*STEPS)) as llm:
        stack = Stack(tmp_path / "home", llm_base_url=llm.base_url, env={"AGENTMESH_AGENT_RECALL_K": "0"})
        await stack.start()
        try:
            gateway = stack.gateway_stub()
            events = await chat(gateway, "work", "fetch the data and report on it", mode="deep")
            requests = llm.requests
            await stack.restart()
            messages = await transcript(stack.gateway_stub(), "work")
        finally:
            await stack.stop()

    finished = of_kind(events, "run_finished")[0]
    assert finished.stop_reason == "completed" and finished.final_text == "Report: the data is 42."
    # The background command's result came to the model at the top of the step after it ended.
    background = of_kind(events, "background_result")
    assert [(b.id, b.status, b.result.stdout) for b in background] == [("bg-1", "finished", "fetched\n")]
    step_three = requests[3]  # plan, step 1, step 2, then this one
    notes = [m["content"] for m in step_three.messages if m["role"] == "system"
             and m["content"].startswith("Background command bg-1")]
    assert len(notes) == 1 and notes[0].endswith("Its output:\nfetched")
    # The board: #3 waited for #1 and #2, then everything was done.
    boards = [[(t.id, t.status, tuple(t.blocked_by), t.blocked) for t in u.tasks] for u in of_kind(events, "task_update")]
    assert boards[0] == [(1, "pending", (), False), (2, "pending", (), False), (3, "pending", (), False)]
    assert boards[1][2] == (3, "pending", (1, 2), True)
    assert boards[-1] == [(1, "done", (), False), (2, "done", (), False), (3, "done", (1, 2), False)]
    read = next(r.result for r in of_kind(events, "tool_result") if r.result.name == "read_file")
    assert read.output.strip().endswith("42")
    # After a restart of every service the board is still the session's.
    latest = [m for m in messages if m.kind == "tasks"][-1]
    assert [(t["id"], t["status"]) for t in json.loads(latest.content)["tasks"]] == [(1, "done"), (2, "done"), (3, "done")]


async def test_cancelling_a_deep_turn_kills_its_background_command(tmp_path):
    steps = [reply("", tool_call("background_run", {"command": "sleep 51.25"})),
             reply("", tool_call("shell", {"command": "sleep 52.75"}))]
    with ScriptedLLMServer(default=script(*steps)) as llm:
        async with Stack(tmp_path / "home", llm_base_url=llm.base_url) as stack:
            gateway = stack.gateway_stub()
            turn = LiveTurn(gateway, "stopme", "work", mode="deep")
            await wait_until(lambda: processes_running("sleep 51.25") and processes_running("sleep 52.75"))
            cancelled = await gateway.Cancel(gateway_pb2.CancelRequest(session_id="stopme"), timeout=10)
            assert cancelled.cancelled
            await turn.finished()
            await wait_until(lambda: not processes_running("sleep 52.75"))
            await wait_until(lambda: not processes_running("sleep 51.25"))
    assert of_kind(turn.events, "run_finished")[0].stop_reason == "cancelled"


async def test_the_gateway_refuses_a_negative_budget_before_anything_is_written(tmp_path):
    import grpc
    import pytest

    with ScriptedLLMServer() as llm:
        async with Stack(tmp_path / "home", llm_base_url=llm.base_url) as stack:
            gateway = stack.gateway_stub()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await chat(gateway, "neg", "hi", session_token_budget=-1)
            listing = await gateway.ListSessions(sessions_pb2.ListSessionsRequest(), timeout=10)
        assert llm.requests == []
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == ("options.session_token_budget must be 0 (the configured budget) or a positive "
                                    "number of tokens")
    assert list(listing.sessions) == []
