"""Wake-ups against the real stack (docs/scheduler.md, "Wake-ups"): the agent's schedule_wakeup
asks the scheduler to resume its session later; the wake-up is a one-off job the user sees in
`cron list`, kept durably — with the scheduler stopped past its time and started again, it fires
once and the session gets the note as its next message. Bounds are sentences the model reads."""

from __future__ import annotations

import asyncio
import os
import sys
import time

from agentmesh.rpc.launch import start_service
from agentmesh.v1 import gateway_pb2, scheduler_pb2, sessions_pb2
from tests.support.llm_server import reply, tool_call
from tests.support.stack import Stack
from tests.support.turns import collect, of_kind


async def cli(stack, *args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTMESH_")}
    env.update(stack.env)
    env.update({f"AGENTMESH_{name.upper()}_ADDR": addr for name, addr in stack.addresses.items()})
    process = await asyncio.create_subprocess_exec(sys.executable, "-m", "agentmesh.cli.main", *args, env=env,
                                                   stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 120)
    return process.returncode or 0, out.decode(), err.decode()


async def transcript(gateway, session_id: str) -> list:
    return list((await gateway.GetTranscript(sessions_pb2.GetTranscriptRequest(session_id=session_id),
                                             timeout=10)).messages)


async def test_schedule_wakeup_resumes_the_session_with_the_note_across_a_scheduler_restart(tmp_path, llm):
    llm.add(reply("", tool_call("schedule_wakeup", {"when": "2s", "note": "check the oven"}, id="w1")),
            reply("I will check back."), reply("Oven checked."))
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url) as stack:
        gateway = stack.gateway_stub()
        events = await collect(gateway.Chat(gateway_pb2.ChatRequest(session_id="baking", message="bake"), timeout=60))
        [result] = of_kind(events, "tool_result")
        assert not result.result.error_kind, result.result.output
        job_id = result.result.output.split()[1]

        # The user sees it as a one-off job on the session.
        jobs = (await stack.scheduler_stub().ListJobs(scheduler_pb2.ListJobsRequest(), timeout=10)).jobs
        [job] = [j for j in jobs if j.job_id == job_id]
        assert job.session_id == "baking" and job.prompt == "check the oven" and job.run_at and not job.done_at
        assert job.source == "wakeup:baking"
        code, out, err = await cli(stack, "cron", "list")
        assert code == 0 and job_id in out and "wake-up of baking" in out, (out, err)

        # The scheduler is away when the wake-up is due, and comes back after.
        host = stack.hosts.pop("scheduler")
        await host.stop(grace=1)
        host.telemetry.shutdown()
        async with asyncio.timeout(30):
            while time.time() <= job.run_at:
                await asyncio.sleep(0.1)
        stack.hosts["scheduler"] = await start_service("scheduler", stack.settings, stack.addresses["scheduler"])

        async with asyncio.timeout(60):
            while not any(m.role == "assistant" and m.content == "Oven checked." for m in await transcript(gateway, "baking")):
                await asyncio.sleep(0.1)
        messages = await transcript(gateway, "baking")
        assert [m.content for m in messages if m.role == "user"] == ["bake", "check the oven"]
        done = await stack.scheduler_stub().GetJob(scheduler_pb2.GetJobRequest(job_id=job_id), timeout=10)
        assert done.done_at > 0
        runs = (await stack.scheduler_stub().ListRuns(scheduler_pb2.ListRunsRequest(job_id=job_id), timeout=10)).runs
        assert len(runs) == 1


async def test_wakeups_are_bounded_per_session_and_in_horizon(tmp_path, llm):
    calls = [tool_call("schedule_wakeup", {"when": "1d", "note": f"n{i}"}, id=f"w{i}") for i in range(11)]
    far = tool_call("schedule_wakeup", {"when": "31d", "note": "far"}, id="far")
    llm.add(reply("", *calls, far), reply("ok"))
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url) as stack:
        gateway = stack.gateway_stub()
        events = await collect(gateway.Chat(gateway_pb2.ChatRequest(session_id="many", message="go"), timeout=60))
        outputs = {r.result.call_id: r.result for r in of_kind(events, "tool_result")}
        assert all(not outputs[f"w{i}"].error_kind for i in range(10))
        assert outputs["w10"].error_kind and "has 10 wake-ups pending, the most it may have" in outputs["w10"].output
        assert outputs["far"].error_kind and "at most 30 days ahead" in outputs["far"].output
        jobs = (await stack.scheduler_stub().ListJobs(scheduler_pb2.ListJobsRequest(), timeout=10)).jobs
        wakeups = [j for j in jobs if j.source == "wakeup:many"]
        assert len(wakeups) == 10

        # The user cancels one (`agentmesh cron cancel-wakeup`); a job that is not a wake-up is refused.
        code, out, err = await cli(stack, "cron", "cancel-wakeup", wakeups[0].job_id)
        assert code == 0 and f"cancelled wake-up {wakeups[0].job_id}" in out, err
        other = await stack.scheduler_stub().CreateJob(scheduler_pb2.CreateJobRequest(job=scheduler_pb2.Job(
            name="nightly", schedule="daily 03:00", prompt="tidy up")), timeout=10)
        code, out, err = await cli(stack, "cron", "cancel-wakeup", other.job_id)
        assert code != 0 and "is not a wake-up" in err
        jobs = (await stack.scheduler_stub().ListJobs(scheduler_pb2.ListJobsRequest(), timeout=10)).jobs
        assert len([j for j in jobs if j.source == "wakeup:many"]) == 9 and other.job_id in [j.job_id for j in jobs]
