"""Plan mode end to end (all five services, a scripted model): the plan is held for approval
through Gateway.Approve before anything runs; approved it runs, denied with a note it is revised,
undecided it ends the turn with nothing run; scheduled runs (plan="auto") approve it at once."""

from __future__ import annotations

import grpc
import pytest

from agentmesh.v1 import gateway_pb2, scheduler_pb2
from tests.e2e.conftest import chat, of_kind
from tests.support.llm_server import ScriptedLLMServer, reply, tool_call
from tests.support.stack import Stack
from tests.support.turns import LiveTurn, wait_until


def planning(request) -> bool:
    last = request.messages[-1]
    return last["role"] == "system" and ("Plan mode:" in last["content"] or "did not approve your plan" in last["content"])


def model(request):
    if planning(request):
        if "did not approve" in request.messages[-1]["content"]:
            return reply("1. write notes.txt in French\n2. report")
        return reply("1. write notes.txt\n2. report")
    tools_done = [m for m in request.messages if m["role"] == "tool"]
    if not tools_done:
        return reply("", tool_call("write_file", {"path": "notes.txt", "content": "plan ran"}))
    return reply("Done as planned.")


@pytest.fixture
async def stack(tmp_path):
    with ScriptedLLMServer(default=model) as llm:
        env = {"AGENTMESH_AGENT_APPROVAL_TIMEOUT_S": "20", "AGENTMESH_AGENT_RECALL_K": "0"}
        async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=env) as running:
            running.llm = llm
            yield running


def workspace_file(stack, session_id: str):
    return stack.settings.home / "workspaces" / session_id / "notes.txt"


async def test_an_approved_plan_runs(stack):
    gateway = stack.gateway_stub()
    turn = LiveTurn(gateway, "plan-ok", "write the notes", plan=True)
    held = await turn.approval_request()
    assert held.name == "approve_plan"
    assert '"plan": "1. write notes.txt\\n2. report"' in held.arguments_json
    # Nothing has run: one model call (the plan, without tools), no file, the board is drafted.
    assert len(stack.llm.requests) == 1 and stack.llm.requests[0].body["tool_choice"] == "none"
    assert not workspace_file(stack, "plan-ok").exists()
    assert [(t.id, t.status) for t in turn.of_kind("task_update")[-1].tasks] == [(1, "pending"), (2, "pending")]
    listing = await gateway.ListApprovals(gateway_pb2.ListApprovalsRequest(session_id="plan-ok"), timeout=10)
    assert [a.name for a in listing.approvals] == ["approve_plan"]

    await gateway.Approve(gateway_pb2.ApproveRequest(session_id="plan-ok", call_id=held.call_id,
                                                     approved=True), timeout=10)
    events = await turn.finished()
    finished = of_kind(events, "run_finished")[0]
    assert finished.stop_reason == "completed" and finished.final_text == "Done as planned."
    assert workspace_file(stack, "plan-ok").read_text() == "plan ran"
    resolved = of_kind(events, "approval_resolved")[0]
    assert (resolved.name, resolved.approved, resolved.decided_by) == ("approve_plan", True, "user")
    step = stack.llm.requests[1]
    assert any("The person approved your plan" in (m["content"] or "") for m in step.messages)


async def test_a_denied_plan_is_revised_with_the_note(stack):
    gateway = stack.gateway_stub()
    turn = LiveTurn(gateway, "plan-no", "write the notes", plan=True)
    first = await turn.approval_request()
    await gateway.Approve(gateway_pb2.ApproveRequest(session_id="plan-no", call_id=first.call_id,
                                                     approved=False, note="in French please"), timeout=10)
    second = await turn.approval_request(1)
    assert "in French" in second.arguments_json
    revise = stack.llm.requests[1].messages[-1]["content"]
    assert revise.startswith("The person did not approve your plan: in French please.")
    assert not workspace_file(stack, "plan-no").exists()
    await gateway.Approve(gateway_pb2.ApproveRequest(session_id="plan-no", call_id=second.call_id,
                                                     approved=True), timeout=10)
    events = await turn.finished()
    assert of_kind(events, "run_finished")[0].stop_reason == "completed"
    board = [(t.id, t.subject, t.status) for t in of_kind(events, "task_update")[-1].tasks]
    assert board == [(1, "write notes.txt", "cancelled"), (2, "report", "cancelled"),
                     (3, "write notes.txt in French", "pending"), (4, "report", "pending")]


async def test_an_undecided_plan_ends_the_turn_with_nothing_run(tmp_path):
    with ScriptedLLMServer(default=model) as llm:
        env = {"AGENTMESH_AGENT_APPROVAL_TIMEOUT_S": "0.5"}
        async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=env) as running:
            events = await chat(running.gateway_stub(), "plan-late", "write the notes", plan=True)
            assert not workspace_file(running, "plan-late").exists()
        assert len(llm.requests) == 1
    finished = of_kind(events, "run_finished")[0]
    assert finished.stop_reason == "plan_rejected"
    assert finished.final_text == "The plan was not approved (no decision within 0.5 s); nothing was run."
    assert of_kind(events, "approval_resolved")[0].decided_by == "timeout"
    assert not of_kind(events, "tool_call")


async def test_auto_approval_for_runs_nobody_watches(stack):
    events = await chat(stack.gateway_stub(), "plan-auto", "write the notes", plan_auto_approve=True)
    resolved = of_kind(events, "approval_resolved")[0]
    assert (resolved.name, resolved.decided_by) == ("approve_plan", "auto")
    assert of_kind(events, "run_finished")[0].final_text == "Done as planned."
    await wait_until(lambda: workspace_file(stack, "plan-auto").exists())


async def test_a_scheduled_job_plans_first_and_approves_its_own_plan(stack):
    from tests.scheduler.test_scheduler_stack import settled_runs

    scheduler = stack.scheduler_stub()
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await scheduler.CreateJob(scheduler_pb2.CreateJobRequest(job=scheduler_pb2.Job(
            name="bad", schedule="daily 06:00", prompt="p", plan="maybe")))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "plan" in refused.value.details()

    job = await scheduler.CreateJob(scheduler_pb2.CreateJobRequest(job=scheduler_pb2.Job(
        name="notes", schedule="daily 06:00", prompt="write the notes", session_id="plan-cron", plan="auto")))
    assert job.plan == "auto"
    await scheduler.TriggerJob(scheduler_pb2.TriggerJobRequest(job_id=job.job_id))
    (run,) = await settled_runs(scheduler, job.job_id, 1)
    assert run.status == "succeeded", run.error
    assert run.summary == "Done as planned."
    # The run planned first (plan mode reached the agent), then carried the plan out.
    assert any(planning(request) for request in stack.llm.requests)
    await wait_until(lambda: workspace_file(stack, "plan-cron").exists())
