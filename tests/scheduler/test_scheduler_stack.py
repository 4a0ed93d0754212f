"""Through the real stack: a scheduled run is a gateway turn like a user's — same agent, same
transcript, one trace — recorded by the scheduler. Real clock; a manual trigger keeps it short."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from agentmesh.v1 import scheduler_pb2, sessions_pb2
from tests.support.llm_server import ScriptedLLMServer, failure, reply
from tests.support.stack import Stack


async def settled_runs(stub, job_id: str, count: int, timeout: float = 60.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        runs = (await stub.ListRuns(scheduler_pb2.ListRunsRequest(job_id=job_id))).runs
        if len(runs) >= count and all(r.status != "running" for r in runs):
            return list(reversed(runs))
        assert loop.time() < deadline, f"runs did not settle: {runs}"
        await asyncio.sleep(0.05)


async def test_a_triggered_run_goes_through_the_gateway(tmp_path):
    with ScriptedLLMServer() as llm:
        llm.add(reply("All quiet overnight."), failure(400, message="bad request"))
        async with Stack(tmp_path / "home", llm_base_url=llm.base_url,
                         env={"AGENTMESH_LLM_MAX_RETRIES": "0"}) as stack:
            scheduler = stack.scheduler_stub()
            job = await scheduler.CreateJob(scheduler_pb2.CreateJobRequest(job=scheduler_pb2.Job(
                name="overnight", schedule="daily 06:00", prompt="What happened overnight?", session_id="ops")))
            await scheduler.TriggerJob(scheduler_pb2.TriggerJobRequest(job_id=job.job_id))
            (run,) = await settled_runs(scheduler, job.job_id, 1)
            assert run.status == "succeeded", run.error
            assert run.summary == "All quiet overnight."
            assert run.session_id == "ops" and len(run.trace_id) == 32

            # The turn is in the session's transcript, as if a user had typed it.
            transcript = await stack.gateway_stub().GetTranscript(sessions_pb2.GetTranscriptRequest(session_id="ops"))
            assert [(m.role, m.content) for m in transcript.messages] == [
                ("user", "What happened overnight?"), ("assistant", "All quiet overnight.")]

            # A model failure is a failed run with the reason, and the job stays scheduled.
            await scheduler.TriggerJob(scheduler_pb2.TriggerJobRequest(job_id=job.job_id))
            runs = await settled_runs(scheduler, job.job_id, 2)
            assert runs[1].status == "failed" and runs[1].error
            still = await scheduler.GetJob(scheduler_pb2.GetJobRequest(job_id=job.job_id))
            assert still.enabled and still.next_run_at > 0


async def test_a_job_runs_in_its_mode_and_a_bad_mode_is_refused(tmp_path):
    with ScriptedLLMServer() as llm:
        llm.add(reply("1. Read the logs\n2. Summarise them"), reply("Logs are clean."))
        # The free-text plan (no task board), so the two scripted replies are the whole turn.
        async with Stack(tmp_path / "home", llm_base_url=llm.base_url,
                         env={"AGENTMESH_AGENT_TASK_MODES": "none"}) as stack:
            scheduler = stack.scheduler_stub()
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await scheduler.CreateJob(scheduler_pb2.CreateJobRequest(job=scheduler_pb2.Job(
                    name="typo", schedule="hourly :15", prompt="Check the logs", mode="deeep")))
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "'deeep' is not a run mode" in refused.value.details()
            assert not (await scheduler.ListJobs(scheduler_pb2.ListJobsRequest())).jobs

            job = await scheduler.CreateJob(scheduler_pb2.CreateJobRequest(job=scheduler_pb2.Job(
                name="deep check", schedule="hourly :15", prompt="Check the logs", session_id="deep-ops", mode="deep")))
            await scheduler.TriggerJob(scheduler_pb2.TriggerJobRequest(job_id=job.job_id))
            (run,) = await settled_runs(scheduler, job.job_id, 1)
            assert run.status == "succeeded", run.error
            # Deep mode reached the agent: its first model call asks for a plan.
            first = llm.requests[0].body["messages"]
            assert any("Deep work mode" in str(m.get("content")) for m in first)
            assert run.summary == "Logs are clean."


async def test_a_job_waits_for_a_users_turn_when_it_enqueues_and_a_bad_policy_is_refused(tmp_path):
    from tests.support.turns import LiveTurn, of_kind

    with ScriptedLLMServer() as llm:
        llm.add(reply("The user's answer.", delay_s=1.0), reply("The report."))
        async with Stack(tmp_path / "home", llm_base_url=llm.base_url) as stack:
            scheduler = stack.scheduler_stub()
            err = None
            try:
                await scheduler.CreateJob(scheduler_pb2.CreateJobRequest(job=scheduler_pb2.Job(
                    name="bad", schedule="daily 06:00", prompt="p", session_id="ops", if_busy="whenever")))
            except grpc.aio.AioRpcError as exc:
                err = exc
            assert err is not None and err.code() == grpc.StatusCode.INVALID_ARGUMENT and "if_busy" in err.details()

            job = await scheduler.CreateJob(scheduler_pb2.CreateJobRequest(job=scheduler_pb2.Job(
                name="report", schedule="daily 06:00", prompt="Report.", session_id="ops", if_busy="enqueue")))
            assert job.if_busy == "enqueue"
            user = LiveTurn(stack.gateway_stub(), "ops", "A question.")
            await asyncio.to_thread(llm.wait_for_requests, 1, 10)
            await scheduler.TriggerJob(scheduler_pb2.TriggerJobRequest(job_id=job.job_id))

            (run,) = await settled_runs(scheduler, job.job_id, 1)
            assert run.status == "succeeded", run.error
            assert run.summary == "The report."
            assert of_kind(await user.finished(), "run_finished")[0].final_text == "The user's answer."
            transcript = await stack.gateway_stub().GetTranscript(sessions_pb2.GetTranscriptRequest(session_id="ops"))
            assert [m.content for m in transcript.messages] == [
                "A question.", "The user's answer.", "Report.", "The report."]


async def test_a_job_runs_its_named_agent_and_an_unknown_agent_fails_the_run_with_the_reason(tmp_path):
    from agentmesh.v1 import agents_pb2

    with ScriptedLLMServer() as llm:
        llm.add(reply("Reviewed."))
        async with Stack(tmp_path / "home", llm_base_url=llm.base_url) as stack:
            await stack.gateway_stub().CreateAgent(agents_pb2.CreateAgentRequest(namespace="default", spec=agents_pb2.AgentSpec(
                name="nightly-reviewer", description="Reviews overnight.", instructions="You are NIGHTLY-REVIEWER.")))
            scheduler = stack.scheduler_stub()
            job = await scheduler.CreateJob(scheduler_pb2.CreateJobRequest(job=scheduler_pb2.Job(
                name="review", schedule="daily 06:00", prompt="Review the night", session_id="review-ops",
                agent="nightly-reviewer")))
            assert job.agent == "nightly-reviewer"
            await scheduler.TriggerJob(scheduler_pb2.TriggerJobRequest(job_id=job.job_id))
            (run,) = await settled_runs(scheduler, job.job_id, 1)
            assert run.status == "succeeded", run.error
            (request,) = llm.requests
            assert "You are NIGHTLY-REVIEWER." in request.messages[0]["content"]
            session = await stack.gateway_stub().GetSession(sessions_pb2.GetSessionRequest(session_id="review-ops"))
            assert (session.agent, session.agent_version) == ("nightly-reviewer", 1)

            ghost = await scheduler.CreateJob(scheduler_pb2.CreateJobRequest(job=scheduler_pb2.Job(
                name="ghost", schedule="daily 07:00", prompt="Anything?", agent="no-such-agent")))
            await scheduler.TriggerJob(scheduler_pb2.TriggerJobRequest(job_id=ghost.job_id))
            (failed,) = await settled_runs(scheduler, ghost.job_id, 1)
            assert failed.status == "failed"
            assert "NOT_FOUND" in failed.error and "no-such-agent" in failed.error, failed.error
            assert len(llm.requests) == 1
