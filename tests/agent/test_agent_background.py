"""Background commands over real gRPC: `background_run` / `background_check` in the tools
service's jail, results put in front of the model at the next step (and sent as
`background_result`), a cap per session, and every way a command is stopped — its lifetime, a
cancelled turn, a deleted session — checked in /proc."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from agentmesh.internal.v1 import agent_service_pb2, tools_service_pb2, tools_service_pb2_grpc
from tests.agent.test_agent_finishing import Running, finished, of_kind, run_turn, statuses
from tests.agent.test_agent_service import agent_stub, open_session, stored, until
from tests.support.identities import signed_channel
from tests.support.llm_server import reply, tool_call
from tests.support.processes import processes_running


def in_order(*steps):
    queue = list(steps)
    return lambda request: queue.pop(0) if queue else reply("Finished.")


def background_notes(request) -> list[str]:
    return [m["content"] for m in request.messages
            if m["role"] == "system" and m["content"].startswith("Background command")]


async def test_a_finished_background_command_is_shown_at_the_next_step(tmp_path):
    steps = [reply("", tool_call("background_run", {"command": "sleep 0.3; echo built-ok"})),
             reply("", tool_call("shell", {"command": "sleep 1.5; echo other work"})),
             reply("The build said built-ok.")]
    async with Running(tmp_path, in_order(*steps)) as running:
        events = await run_turn(running.stack, "bg", "build in the background")
        requests = running.llm.requests
        messages = await stored(running.stack, "bg")
    started = of_kind(events, "tool_result")[0].result
    assert not started.is_error and "Started bg-1 in the background" in started.output
    assert [background_notes(r) for r in requests[:2]] == [[], []]
    note = background_notes(requests[2])
    assert len(note) == 1 and note[0].startswith(
        "Background command bg-1 (`sleep 0.3; echo built-ok`) finished with exit code 0 after ")
    assert note[0].endswith("Its output:\nbuilt-ok")
    # After the step's tool results: the model reads it at the top of its next step.
    assert requests[2].messages[-1]["content"] == note[0]
    result = of_kind(events, "background_result")
    assert [(b.id, b.status, b.result.exit_code, b.result.stdout) for b in result] == [
        ("bg-1", "finished", 0, "built-ok\n")]
    assert any(m.role == "system" and m.content == note[0] for m in messages)  # durable
    assert finished(events).final_text == "The build said built-ok."
    assert "background command bg-1 ended (finished); its result goes to the model" in statuses(events)


async def test_check_reports_and_the_cap_per_session_holds(tmp_path):
    steps = [reply("", tool_call("background_run", {"command": "sleep 45.25"}),
                   tool_call("background_run", {"command": "sleep 45.5"})),
             reply("", tool_call("background_check", {})),
             reply("", tool_call("background_check", {"id": "bg-7"})),
             reply("One runs.")]
    async with Running(tmp_path, in_order(*steps), env={"AGENTMESH_TOOLS_BACKGROUND_PER_SESSION": "1"}) as running:
        events = await run_turn(running.stack, "cap", "start two")
        # The jail starts on its own after background_run answers: under load, after the turn.
        await until(lambda: processes_running("sleep 45.25"))
        assert not processes_running("sleep 45.5")
    # Results stream as calls end (the first start answers once the agent has been told of it);
    # read them in the order of the calls.
    results = {r.result.call_id: r.result for r in of_kind(events, "tool_result")}
    first, second, check, unknown = (results[c.call_id] for c in of_kind(events, "tool_call"))
    assert not first.is_error
    assert second.error_kind == "too_many_background" and "the limit is 1" in second.output
    assert check.output.startswith("bg-1 `sleep 45.25` — running after ")
    assert unknown.error_kind == "not_found" and "known: bg-1" in unknown.output
    # Stopping the stack stops what still runs.
    await until(lambda: not processes_running("sleep 45.25"))


async def test_a_command_past_its_lifetime_is_stopped_and_reported(tmp_path):
    steps = [reply("", tool_call("background_run", {"command": "sleep 46.75", "timeout_s": 0.5})),
             reply("", tool_call("shell", {"command": "sleep 2"})),
             reply("It timed out.")]
    async with Running(tmp_path, in_order(*steps)) as running:
        events = await run_turn(running.stack, "life", "go")
        third = running.llm.requests[2]
        assert not processes_running("sleep 46.75")
    assert "ran past its lifetime and was stopped" in background_notes(third)[0]
    assert of_kind(events, "background_result")[0].result.error_kind == "timeout"


async def test_cancelling_the_turn_kills_its_background_commands(tmp_path):
    steps = [reply("", tool_call("background_run", {"command": "sleep 47.25"})),
             reply("", tool_call("shell", {"command": "sleep 48.75"}))]
    async with Running(tmp_path, in_order(*steps)) as running:
        await open_session(running.stack, "cancel-bg")
        call = agent_stub(running.stack).RunTurn(
            iter([agent_service_pb2.RunTurnRequest(session_id="cancel-bg", message="go")]), timeout=60)
        seen = []
        async for event in call:
            seen.append(event.WhichOneof("payload"))
            if seen.count("tool_call") == 2:
                break
        await until(lambda: processes_running("sleep 47.25") and processes_running("sleep 48.75"))
        call.cancel()
        await until(lambda: not processes_running("sleep 48.75"))
        await until(lambda: not processes_running("sleep 47.25"))


async def test_deleting_the_session_kills_its_background_commands(tmp_path):
    steps = [reply("", tool_call("background_run", {"command": "sleep 49.25"})), reply("Started.")]
    async with Running(tmp_path, in_order(*steps)) as running:
        events = await run_turn(running.stack, "doomed", "go")
        assert finished(events).final_text == "Started."
        await asyncio.sleep(0.2)
        assert processes_running("sleep 49.25")  # it outlives the turn...
        stack = running.stack  # the gateway deletes a session's workspace: play the gateway
        async with signed_channel(stack.settings.keys_dir, "gateway", "tools", stack.addresses["tools"]) as channel:
            gateway_as_caller = tools_service_pb2_grpc.ToolsStub(channel)
            # Only the agent may collect or stop a session's background commands.
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await gateway_as_caller.StopBackground(tools_service_pb2.StopBackgroundRequest(session_id="doomed"), timeout=10)
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert processes_running("sleep 49.25")
            await gateway_as_caller.DeleteWorkspace(tools_service_pb2.DeleteWorkspaceRequest(session_id="doomed"), timeout=10)
        await until(lambda: not processes_running("sleep 49.25"))  # ...not the session


async def test_the_next_turn_gets_what_finished_after_the_last_one(tmp_path):
    steps = [reply("", tool_call("background_run", {"command": "sleep 0.2; echo later"})), reply("Started it."),
             reply("It said later.")]
    async with Running(tmp_path, in_order(*steps)) as running:
        await run_turn(running.stack, "later", "start it")
        await asyncio.sleep(0.8)
        events = await run_turn(running.stack, "later", "what happened?")
        last = running.llm.requests[-1]
    assert "echo later" in background_notes(last)[0] and background_notes(last)[0].endswith("later")
    assert len(of_kind(events, "background_result")) == 1
