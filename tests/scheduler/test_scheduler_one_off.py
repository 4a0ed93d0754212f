"""One-off jobs (`run_at`): fired once through the claim, recorded, then kept done; across a
restart and downtime; refused with a sentence when the time is unusable."""

from __future__ import annotations

import grpc
import pytest

from agentmesh.v1 import scheduler_pb2
from tests.scheduler.conftest import T0


async def _job(replica, job_id: str) -> scheduler_pb2.Job:
    return await replica.stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job_id))


async def test_a_one_off_job_fires_once_and_is_kept_done(harness, gateway):
    replica = await harness.start()
    job = await replica.create(name="remind", run_at=T0 + 90, prompt="remind me")
    assert (job.schedule, job.run_at, job.next_run_at, job.done_at) == ("", T0 + 90, T0 + 90, 0)

    await harness.tick(90)
    (run,) = await replica.settled(job.job_id)
    assert (run.status, run.trigger, run.scheduled_for) == ("succeeded", "schedule", T0 + 90)
    done = await _job(replica, job.job_id)
    assert done.done_at > 0 and done.next_run_at == 0 and done.last_run_at == run.started_at

    await harness.tick(3600, step=60)
    assert len(await replica.runs(job.job_id)) == 1
    assert [c.message for c in gateway.calls] == ["remind me"]


async def test_a_one_off_missed_while_down_runs_once_on_return(harness, gateway):
    first = await harness.start()
    job = await first.create(name="remind", run_at=T0 + 30, prompt="remind me")
    await harness.stop(first)
    await harness.clock.advance(3600)  # nobody was running when it was due
    second = await harness.start()
    await harness.tick(5)
    (run,) = await second.settled(job.job_id)
    assert (run.status, run.trigger, run.scheduled_for) == ("succeeded", "catch_up", T0 + 30)
    await harness.tick(600, step=60)
    assert len(await second.runs(job.job_id)) == 1
    assert (await _job(second, job.job_id)).done_at > 0


async def test_unusable_one_off_times_are_refused_and_change_nothing(harness):
    replica = await harness.start()
    for fields, says in [
        ({"run_at": T0 - 1}, "is in the past"),
        ({"run_at": T0 + 367 * 86400}, "at most 366 days"),
        ({"run_at": T0 + 60, "schedule": "every 1m"}, "not both"),
        ({"run_at": float("inf")}, "must be a time"),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await replica.create(name="n", prompt="p", **fields)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and says in info.value.details(), fields
    assert not (await replica.stub.ListJobs(scheduler_pb2.ListJobsRequest())).jobs

    job = await replica.create(name="n", prompt="p", run_at=T0 + 60)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await replica.stub.UpdateJob(scheduler_pb2.UpdateJobRequest(
            job=scheduler_pb2.Job(job_id=job.job_id, run_at=T0 - 60), update_mask=["run_at"]))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "in the past" in info.value.details()
    assert (await _job(replica, job.job_id)).run_at == T0 + 60


async def test_a_new_time_rearms_a_done_job(harness):
    replica = await harness.start()
    job = await replica.create(name="n", prompt="p", run_at=T0 + 10)
    await harness.tick(10)
    await replica.runs_until(job.job_id, lambda runs: len(runs) == 1 and runs[0].status == "succeeded")
    rearmed = await replica.stub.UpdateJob(scheduler_pb2.UpdateJobRequest(
        job=scheduler_pb2.Job(job_id=job.job_id, run_at=T0 + 100), update_mask=["run_at"]))
    assert (rearmed.done_at, rearmed.next_run_at) == (0, T0 + 100)
    await harness.tick(90)
    await replica.runs_until(job.job_id, lambda runs: len(runs) == 2)
