"""The task board over real gRPC (agent, memory and tools services; a scripted OpenAI-protocol
model): tools with dependencies, cycles refused, completion unblocking, a `task_update` event with
the whole board, durability across a restart of every service and across compaction, deep
mode's plan as the board, and the nudge when a deep turn stops with tasks open."""

from __future__ import annotations

import pytest

from agentmesh.agent.capabilities.tasks import Board, BoardError
from tests.agent.test_agent_finishing import Running, finished, of_kind, run_turn, statuses
from tests.agent.test_agent_service import stored
from tests.support.llm_server import failure, reply, tool_call


def board_of(event) -> list[tuple[int, str, str, tuple[int, ...], bool]]:
    return [(t.id, t.subject, t.status, tuple(t.blocked_by), t.blocked) for t in event.tasks]


def results(events) -> list:
    return [e.result for e in of_kind(events, "tool_result")]


def pinned_board(request) -> str:
    """The board pinned after the user's message in a deep step ("" when none)."""
    found = [m["content"] for m in request.messages
             if m["role"] == "system" and m["content"].startswith("Your task board")]
    return found[-1] if found else ""


def scripted(*steps):
    """Replies in order for the turn's steps; a plan call (deep) gets `plan`."""
    queue = list(steps)

    def model(request):
        last = request.messages[-1]
        if last["role"] == "system" and "numbered plan" in last["content"]:
            return reply("1. build the parser\n2. write the tests")
        return queue.pop(0) if queue else reply("Finished.")

    return model


BUILD = [
    reply("", tool_call("task_create", {"subject": "fetch data"}),
          tool_call("task_create", {"subject": "clean data", "blocked_by": [1]})),
    reply("", tool_call("task_create", {"subject": "report", "description": "a table", "blocked_by": [2]})),
    reply("", tool_call("task_update", {"id": 1, "add_blocked_by": [3]}),  # would close a cycle
          tool_call("task_update", {"id": 2, "status": "in_progress"})),  # blocked by #1
    reply("", tool_call("task_update", {"id": 1, "status": "done"})),
    reply("", tool_call("task_get", {"id": 2}), tool_call("task_list", {})),
    reply("Board built."),
]


async def test_tasks_with_dependencies_over_the_wire(tmp_path):
    async with Running(tmp_path, scripted(*BUILD), task_modes="default") as running:
        events = await run_turn(running.stack, "board", "plan the data work")
        tools = [t["function"]["name"] for t in running.llm.requests[0].body["tools"]]
    assert {"task_create", "task_update", "task_get", "task_list"} <= set(tools)
    out = results(events)
    assert out[0].output == "Created [ ] #1 fetch data — pending"
    assert out[1].output == "Created [ ] #2 clean data — pending (blocked by #1)"
    cycle, blocked = out[3], out[4]
    assert cycle.error_kind == "task_refused" and "would close a cycle (#1 → #3 → #2 → #1)" in cycle.output
    assert blocked.error_kind == "task_refused" and "#2 is blocked by #1" in blocked.output
    assert out[5].output == "Updated [x] #1 fetch data — done; now unblocked: #2 clean data"
    assert "Waits for: #1. Needed by: #3." in out[6].output and "Description: (none)" in out[6].output
    assert out[7].output.splitlines() == ["[x] #1 fetch data — done", "[ ] #2 clean data — pending",
                                          "[ ] #3 report — pending (blocked by #2)"]
    # One task_update event per change, each with the whole board; refused changes send none.
    updates = of_kind(events, "task_update")
    assert len(updates) == 4
    assert board_of(updates[-1]) == [(1, "fetch data", "done", (), False), (2, "clean data", "pending", (1,), False),
                                     (3, "report", "pending", (2,), True)]
    assert finished(events).final_text == "Board built."


async def test_the_board_survives_a_restart_of_every_service_and_compaction(tmp_path):
    steps = [*BUILD[:2], reply("Two tasks so far."),  # turn 1: three tasks
             # turn 2 (deep): the board is pinned; no new plan; the model finishes #1
             reply("", tool_call("task_update", {"id": 1, "status": "done"})),
             reply("", tool_call("task_update", {"id": 2, "status": "done"})),
             reply("", tool_call("task_update", {"id": 3, "status": "done"})),
             reply("All three done.")]

    def model(request):
        if request.messages[0]["content"].startswith("You compact a conversation"):
            return reply("Summary: three data tasks were planned.")
        return queue(request)

    queue = scripted(*steps)
    async with Running(tmp_path, model, task_modes="default,deep", compact_at_chars=1500,
                       context_budget_chars=2000) as running:
        first = await run_turn(running.stack, "durable", "plan the data work " + "(details) " * 200)
        assert finished(first).final_text == "Two tasks so far."
        await running.stack.restart()
        second = await run_turn(running.stack, "durable", "now do it", mode="deep")
        requests = running.llm.requests
        messages = await stored(running.stack, "durable")
    assert any("compacted" in s for s in statuses(second))  # the history was summarised...
    step_one = next(r for r in requests if "now do it" in str(r.messages) and r.body.get("tool_choice") == "auto")
    # ...and the board, kept apart from the conversation, is still there and pinned.
    assert "[ ] #1 fetch data — pending\n[ ] #2 clean data — pending (blocked by #1)" in pinned_board(step_one)
    assert "deep work: continuing with the task board (3 open tasks; up to 50 steps)" in statuses(second)
    assert not any("numbered plan" in r.messages[-1]["content"] for r in requests)
    assert finished(second).final_text == "All three done."
    assert [t.status for t in of_kind(second, "task_update")[-1].tasks] == ["done"] * 3
    # The model never sees the board entries as messages.
    assert all('"next_id"' not in (m.get("content") or "") for r in requests for m in r.messages)
    assert sum(m.kind == "tasks" for m in messages) == 3 + 3  # one entry per change


async def test_deep_mode_plans_into_the_board_and_pins_it(tmp_path):
    steps = [reply("", tool_call("task_update", {"id": 1, "status": "in_progress"})),
             reply("", tool_call("task_update", {"id": 1, "status": "done"}),
                   tool_call("task_update", {"id": 2, "status": "done"})),
             reply("Parser built and tested.")]
    async with Running(tmp_path, scripted(*steps)) as running:
        events = await run_turn(running.stack, "deep-board", "build a parser", mode="deep")
        requests = running.llm.requests
    updates = of_kind(events, "task_update")
    assert board_of(updates[0]) == [(1, "build the parser", "pending", (), False),
                                    (2, "write the tests", "pending", (), False)]
    assert "[~] #1 build the parser — in_progress" in pinned_board(requests[2])
    assert "[x] #1 build the parser — done\n[x] #2 write the tests — done" in pinned_board(requests[3])
    assert finished(events).final_text == "Parser built and tested." and finished(events).iterations == 4


def nudges(request) -> list[str]:
    return [m["content"] for m in request.messages if m["role"] == "system" and "still open" in m["content"]]


@pytest.mark.parametrize("allowed", [2, 0])
async def test_a_deep_turn_that_stops_with_tasks_open_is_nudged_boundedly(tmp_path, allowed):
    steps = [reply("I think that is it."), reply("", tool_call("task_update", {"id": 1, "status": "done"})),
             reply("Still stopping here."), reply("Really stopping.")]
    async with Running(tmp_path, scripted(*steps), deep_nudges=allowed) as running:
        events = await run_turn(running.stack, "nudge", "build a parser", mode="deep")
        requests = running.llm.requests
    if allowed == 0:
        assert finished(events).final_text == "I think that is it." and len(requests) == 2
        return
    # Nudged after the first answer (two tasks open) and the second (one open); then it may stop.
    assert [len(nudges(r)) for r in requests] == [0, 0, 1, 1, 2]
    assert "[ ] #1 build the parser — pending\n[ ] #2 write the tests — pending" in nudges(requests[2])[0]
    assert nudges(requests[4])[-1].splitlines()[1] == "[ ] #2 write the tests — pending"
    assert "2 open tasks left; asking the model to carry on (nudge 1 of 2)" in statuses(events)
    assert finished(events).stop_reason == "completed" and finished(events).final_text == "Really stopping."


async def test_the_board_is_not_offered_outside_its_modes(tmp_path):
    async with Running(tmp_path, scripted(reply("hi")), task_modes="deep") as running:
        await run_turn(running.stack, "plain", "hello")
        tools = [t["function"]["name"] for t in running.llm.requests[0].body["tools"]]
    assert not [t for t in tools if t.startswith("task_")]


async def test_the_board_is_offered_by_default_where_the_window_allows(tmp_path):
    # The default model's window: 32 768 tokens by default (roomy), 8 192 when configured so.
    async with Running(tmp_path, scripted(reply("hi"), reply("hi"))) as roomy:
        await run_turn(roomy.stack, "plain", "hello")
        offered = [t["function"]["name"] for t in roomy.llm.requests[0].body["tools"]]
    async with Running(tmp_path / "small", scripted(reply("hi")), env={"AGENTMESH_LLM_CONTEXT_WINDOW": "8192"}) as small:
        await run_turn(small.stack, "plain", "hello")
        cramped = [t["function"]["name"] for t in small.llm.requests[0].body["tools"]]
    assert {"task_create", "delegate_task"} <= set(offered)
    assert not {"task_create", "delegate_task"} & set(cramped)


def test_board_rules():
    board = Board()
    a, b, c = board.create("a"), board.create("b", blocked_by=[1]), board.create("c", blocked_by=[1, 2])
    with pytest.raises(BoardError, match="cycle"):
        board.update(a.id, add_blocked_by=[c.id])
    with pytest.raises(BoardError, match="itself"):
        board.update(a.id, add_blocked_by=[a.id])
    with pytest.raises(BoardError, match="no task #9"):
        board.create("d", blocked_by=[9])
    with pytest.raises(BoardError, match="blocked by #1"):
        board.update(b.id, status="done")
    board.update(b.id, status="cancelled")  # giving up on a blocked task is allowed
    board.update(a.id, status="done")
    assert board.waiting_on(c) == [2]  # a cancelled blocker still blocks: drop the dependency to go on
    board.update(c.id, remove_blocked_by=[2], status="done")
    assert Board.from_json(board.to_json()) == board
    with pytest.raises(BoardError, match="'subject' is empty"):
        board.create("   ")


async def test_a_sub_agent_can_be_handed_a_task_and_reports_on_it(tmp_path):
    def model(request):
        last = request.messages[-1]
        if last["role"] == "system" and "numbered plan" in last["content"]:
            return reply("1. research the API\n2. summarise")
        if "You are a sub-agent" in request.messages[0]["content"]:
            if "break" in request.messages[1]["content"]:
                return failure(400, message="the child's model refuses")
            return reply("The API has three endpoints.")
        results = [m for m in request.messages if m["role"] == "tool"]
        if not results:
            return reply("", tool_call("delegate_task", {"task": "Research the API.", "task_id": 1}),
                         tool_call("delegate_task", {"task": "break this one", "task_id": 2}))
        if len(results) == 2:
            return reply("", tool_call("delegate_task", {"task": "again", "task_id": 1}))
        return reply("Summarised.", tool_call("task_update", {"id": 2, "status": "cancelled"})) \
            if len(results) == 3 else reply("Summarised.")

    async with Running(tmp_path, model, subagent_max_iterations=2) as running:
        events = await run_turn(running.stack, "handed", "research and summarise", mode="deep")
    calls = [c.call_id for c in of_kind(events, "tool_call") if c.name == "delegate_task"]
    by_call = {r.call_id: r for r in results(events)}
    handed = [by_call[c] for c in calls]  # in call order (results arrive as they finish)
    assert handed[0].output == "The API has three endpoints.\n[task #1 marked done]"
    assert handed[1].is_error and handed[1].output.endswith("[task #2 is pending again: the sub-agent did not finish it]")
    assert handed[2].error_kind == "task_refused" and "task #1" in handed[2].output
    boards = [board_of(u) for u in of_kind(events, "task_update")]
    owners = {(t.id, t.status, t.owner) for u in of_kind(events, "task_update") for t in u.tasks}
    assert (1, "in_progress", "sub-agent 1") in owners and (2, "in_progress", "sub-agent 2") in owners
    assert [s for _, _, s, _, _ in boards[-1]] == ["done", "cancelled"]



async def test_a_sub_agent_of_a_planned_turn_does_not_plan_again(tmp_path):
    def model(request):
        last = request.messages[-1]
        if last["role"] == "system" and "Plan mode:" in last["content"]:
            return reply("1. delegate the research")
        if "You are a sub-agent" in request.messages[0]["content"]:
            return reply("researched")
        if not [m for m in request.messages if m["role"] == "tool"]:
            return reply("", tool_call("delegate_task", {"task": "research", "task_id": 1}))
        return reply("Done.")

    async with Running(tmp_path, model, subagent_modes="default,deep") as running:
        events = await run_turn(running.stack, "planned", "research", plan_auto_approve=True)
        planning = [r for r in running.llm.requests if "Plan mode:" in str(r.messages[-1].get("content"))]
    assert [a.name for a in of_kind(events, "approval_request")] == ["approve_plan"]  # the parent's only
    assert len(planning) == 1 and finished(events).final_text == "Done."
    assert [t.status for t in of_kind(events, "task_update")[-1].tasks] == ["done"]
