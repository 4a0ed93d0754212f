"""The Scheduler RPCs over real gRPC: create, update, get, list, toggle, delete, trigger, runs,
and the refusals — right status, a readable message, nothing changed."""

from __future__ import annotations

import grpc
import pytest

from agentmesh.v1 import scheduler_pb2
from tests.scheduler.conftest import T0


async def expect_error(call, code: grpc.StatusCode, says: str):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == code, info.value.details()
    assert says in info.value.details()
    return info.value


async def test_create_fills_defaults_and_next_run(harness):
    replica = await harness.start()
    job = await replica.create(name="morning summary", schedule="daily 09:00", prompt="summarise the inbox",
                               timezone="Europe/Berlin")
    assert job.job_id.startswith("job-")
    assert job.enabled and job.concurrency_policy == "forbid" and job.missed_run_policy == "run_once"
    assert job.created_at == job.updated_at == T0
    assert job.next_run_at == T0 + 8 * 3600  # 09:00 CET is 08:00 UTC
    assert job.last_run_at == 0
    fetched = await replica.stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job.job_id))
    assert fetched == job
    listed = await replica.stub.ListJobs(scheduler_pb2.ListJobsRequest())
    assert [j.job_id for j in listed.jobs] == [job.job_id]


async def test_create_with_client_id_and_disabled(harness):
    replica = await harness.start()
    job = await replica.create(job_id="nightly", name="n", schedule="0 3 * * *", prompt="p", enabled=False)
    assert job.job_id == "nightly" and not job.enabled and job.next_run_at == 0
    await expect_error(replica.create(job_id="nightly", name="n", schedule="0 3 * * *", prompt="p"),
                       grpc.StatusCode.ALREADY_EXISTS, "already exists")


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"name": "", "schedule": "every 1m", "prompt": "p"}, "name is required"),
        ({"name": "n", "schedule": "every 1m", "prompt": "  "}, "prompt is empty"),
        ({"name": "n", "schedule": "every 1m", "prompt": "p" * 100_001}, "limit is 100000"),
        ({"name": "n", "schedule": "61 * * * *", "prompt": "p"}, "minute field '61'"),
        ({"name": "n", "schedule": "every 1m", "prompt": "p", "timezone": "Moon/Base"}, "timezone 'Moon/Base' is unknown"),
        ({"name": "n", "schedule": "every 1m", "prompt": "p", "session_id": "../etc"}, "session_id '../etc' is malformed"),
        ({"name": "n", "schedule": "every 1m", "prompt": "p", "concurrency_policy": "queue"}, "concurrency_policy 'queue'"),
        ({"name": "n", "schedule": "every 1m", "prompt": "p", "missed_run_policy": "all"}, "missed_run_policy 'all'"),
        ({"name": "n", "schedule": "every 1m", "prompt": "p", "mode": "deep work!"}, "mode 'deep work!' is not a run mode"),
        ({"job_id": "a/b", "name": "n", "schedule": "every 1m", "prompt": "p"}, "job_id 'a/b' is malformed"),
    ],
)
async def test_bad_jobs_are_refused_and_nothing_is_created(harness, fields, says):
    replica = await harness.start()
    await expect_error(replica.create(**fields), grpc.StatusCode.INVALID_ARGUMENT, says)
    assert not (await replica.stub.ListJobs(scheduler_pb2.ListJobsRequest())).jobs


async def test_update_applies_mask_or_set_fields_and_retimes(harness):
    replica = await harness.start()
    job = await replica.create(name="n", schedule="every 10m", prompt="p")
    await harness.clock.advance(120)
    updated = await replica.stub.UpdateJob(scheduler_pb2.UpdateJobRequest(
        job=scheduler_pb2.Job(job_id=job.job_id, schedule="every 1h", prompt="new prompt")))
    assert (updated.schedule, updated.prompt, updated.name) == ("every 1h", "new prompt", "n")
    assert updated.next_run_at == T0 + 120 + 3600  # a new interval counts from the edit
    assert updated.updated_at == T0 + 120
    # With a mask, only the named fields apply, even to empty values.
    masked = await replica.stub.UpdateJob(scheduler_pb2.UpdateJobRequest(
        job=scheduler_pb2.Job(job_id=job.job_id, name="renamed", prompt="ignored", enabled=False),
        update_mask=["name", "enabled"]))
    assert (masked.name, masked.prompt, masked.enabled, masked.next_run_at) == ("renamed", "new prompt", False, 0)


async def test_bad_updates_change_nothing(harness):
    replica = await harness.start()
    job = await replica.create(name="n", schedule="every 10m", prompt="p")
    await expect_error(replica.stub.UpdateJob(scheduler_pb2.UpdateJobRequest(
        job=scheduler_pb2.Job(job_id=job.job_id, schedule="every 10 fortnights"))),
        grpc.StatusCode.INVALID_ARGUMENT, "unit s, m, h or d")
    await expect_error(replica.stub.UpdateJob(scheduler_pb2.UpdateJobRequest(
        job=scheduler_pb2.Job(job_id=job.job_id), update_mask=["next_run_at"])),
        grpc.StatusCode.INVALID_ARGUMENT, "cannot be updated")
    await expect_error(replica.stub.UpdateJob(scheduler_pb2.UpdateJobRequest(
        job=scheduler_pb2.Job(job_id="nope", name="x"))), grpc.StatusCode.NOT_FOUND, "no job with id 'nope'")
    assert await replica.stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job.job_id)) == job


async def test_toggle_disables_and_reenables_from_now(harness):
    replica = await harness.start()
    job = await replica.create(name="n", schedule="hourly :30", prompt="p")
    assert job.next_run_at == T0 + 1800
    off = await replica.stub.ToggleJob(scheduler_pb2.ToggleJobRequest(job_id=job.job_id))
    assert not off.enabled and off.next_run_at == 0
    await harness.tick(7200, step=600)
    assert await replica.runs(job.job_id) == []  # nothing fired while disabled
    on = await replica.stub.ToggleJob(scheduler_pb2.ToggleJobRequest(job_id=job.job_id))
    assert on.enabled and on.next_run_at == T0 + 7200 + 1800  # no catch-up for disabled time


async def test_delete_and_not_found(harness):
    replica = await harness.start()
    job = await replica.create(name="n", schedule="every 1m", prompt="p")
    deleted = await replica.stub.DeleteJob(scheduler_pb2.DeleteJobRequest(job_id=job.job_id))
    assert deleted.deleted
    again = await replica.stub.DeleteJob(scheduler_pb2.DeleteJobRequest(job_id=job.job_id))
    assert not again.deleted
    await expect_error(replica.stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job.job_id)),
                       grpc.StatusCode.NOT_FOUND, "no job with id")
    await expect_error(replica.stub.GetJob(scheduler_pb2.GetJobRequest(job_id="")),
                       grpc.StatusCode.INVALID_ARGUMENT, "job_id is required")
    await expect_error(replica.stub.TriggerJob(scheduler_pb2.TriggerJobRequest(job_id="ghost")),
                       grpc.StatusCode.NOT_FOUND, "no job with id 'ghost'")


async def test_trigger_runs_now_through_the_gateway_and_is_recorded(harness, gateway):
    replica = await harness.start()
    job = await replica.create(name="n", schedule="daily 09:00", prompt="do the thing", session_id="ops")
    run = await replica.stub.TriggerJob(scheduler_pb2.TriggerJobRequest(job_id=job.job_id))
    assert run.status == "running" and run.trigger == "manual" and run.session_id == "ops"
    (done,) = await replica.settled(job.job_id)
    assert done.run_id == run.run_id and done.status == "succeeded"
    assert done.summary == "done: do the thing" and len(done.trace_id) == 32
    assert done.started_at == done.finished_at == T0  # the fake clock stood still
    assert [c.session_id for c in gateway.calls] == ["ops"]
    job_now = await replica.stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job.job_id))
    assert job_now.last_run_at == T0 and job_now.next_run_at == job.next_run_at


async def test_list_runs_bounds(harness):
    replica = await harness.start()
    await expect_error(replica.stub.ListRuns(scheduler_pb2.ListRunsRequest(limit=501)),
                       grpc.StatusCode.INVALID_ARGUMENT, "limit must be between 1 and 500")
    await expect_error(replica.stub.ListRuns(scheduler_pb2.ListRunsRequest(limit=-1)),
                       grpc.StatusCode.INVALID_ARGUMENT, "limit")
    await expect_error(replica.stub.ListRuns(scheduler_pb2.ListRunsRequest(job_id="ghost")),
                       grpc.StatusCode.NOT_FOUND, "ghost")


async def test_history_is_pruned_to_the_limit(harness):
    replica = await harness.start({"AGENTMESH_SCHEDULER_HISTORY_LIMIT": "3"})
    job = await replica.create(name="n", schedule="every 1m", prompt="p")
    for minute in range(1, 6):
        await harness.clock.advance(60)
        await replica.runs_until(job.job_id, lambda runs, m=minute: runs[-1:] and runs[-1].scheduled_for == T0 + 60 * m
                                 and runs[-1].status == "succeeded")
    runs = await replica.runs(job.job_id)
    assert [r.scheduled_for for r in runs] == [T0 + 180, T0 + 240, T0 + 300]
