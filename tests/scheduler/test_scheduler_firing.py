"""Firing on a fake clock through a real (fake) Gateway: on time, across restarts and downtime,
under each concurrency policy, through failures, and across a DST change."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import grpc
import pytest

from agentmesh.v1 import scheduler_pb2
from tests.scheduler.conftest import T0, eventually

HOUR = 3600


async def test_runs_fire_at_each_due_time_and_record_everything(harness, gateway):
    replica = await harness.start()
    job = await replica.create(name="poll", schedule="*/15 * * * *", prompt="poll the feed")
    await harness.tick(HOUR, step=60)
    runs = await replica.runs_until(job.job_id, lambda r: len(r) == 4 and all(x.status == "succeeded" for x in r))
    assert [r.scheduled_for for r in runs] == [T0 + 900 * k for k in range(1, 5)]
    assert all(r.trigger == "schedule" and r.started_at == r.scheduled_for for r in runs)
    # A fresh session per run, named after the job, each with its own trace.
    sessions = [r.session_id for r in runs]
    assert len(set(sessions)) == 4 and all(s.startswith(job.job_id) for s in sessions)
    assert [c.session_id for c in gateway.calls] == sessions
    assert len({r.trace_id for r in runs}) == 4
    latest = await replica.stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job.job_id))
    assert latest.last_run_at == T0 + HOUR and latest.next_run_at == T0 + HOUR + 900


async def test_trace_id_is_the_one_the_gateway_saw(harness, gateway):
    replica = await harness.start()
    job = await replica.create(name="t", schedule="every 1m", prompt="p")
    await harness.clock.advance(60)
    (run,) = await replica.runs_until(job.job_id, lambda r: len(r) == 1 and r[0].status == "succeeded")
    # The fake gateway answers with the trace id of the traceparent it received, so this
    # proves the scheduler's span context crossed the hop.
    assert run.trace_id and run.trace_id != "0" * 32


@pytest.mark.parametrize("answer_s", [0, 0.3], ids=["at-once", "slow-gateway"])
async def test_fixed_session_is_reused(harness, gateway, answer_s):
    gateway.delay_s = answer_s  # each run still being answered when the test's clock would move on
    replica = await harness.start()
    job = await replica.create(name="n", schedule="every 1m", prompt="p", session_id="standup")
    await harness.tick(180, step=60)
    runs = await replica.runs_until(job.job_id, lambda r: len(r) == 3 and all(x.status == "succeeded" for x in r))
    assert {r.session_id for r in runs} == {"standup"}
    assert {c.session_id for c in gateway.calls} == {"standup"}


async def test_failing_run_is_recorded_and_the_schedule_carries_on(harness, gateway):
    replica = await harness.start()
    job = await replica.create(name="flaky", schedule="every 10m", prompt="FAIL please")
    await harness.clock.advance(600)
    (failed,) = await replica.runs_until(job.job_id, lambda r: len(r) == 1 and r[0].status == "failed")
    assert failed.error == "UNAVAILABLE: the model is unreachable"
    assert failed.finished_at == T0 + 600 and failed.trace_id
    await replica.stub.UpdateJob(scheduler_pb2.UpdateJobRequest(
        job=scheduler_pb2.Job(job_id=job.job_id, prompt="fine now"), update_mask=["prompt"]))
    await harness.clock.advance(600)
    runs = await replica.runs_until(job.job_id, lambda r: len(r) == 2 and r[1].status == "succeeded")
    assert runs[1].scheduled_for == T0 + 1200 and runs[1].summary == "done: fine now"


async def test_gateway_unreachable_is_a_failed_run_not_a_crash(harness, gateway):
    replica = await harness.start()
    job = await replica.create(name="n", schedule="every 1m", prompt="p")
    await gateway.server.stop(0)
    await harness.clock.advance(60)
    (run,) = await replica.runs_until(job.job_id, lambda r: len(r) == 1 and r[0].status == "failed")
    assert run.error.startswith("UNAVAILABLE")
    assert (await replica.stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job.job_id))).next_run_at == T0 + 120


async def test_restart_in_the_middle_of_a_schedule_keeps_the_timetable(harness, gateway):
    replica = await harness.start()
    job = await replica.create(name="n", schedule="every 10m", prompt="p")
    await harness.tick(600, step=60)
    await replica.runs_until(job.job_id, lambda r: len(r) == 1 and r[0].status == "succeeded")
    await harness.tick(240, step=60)  # 4 minutes into the next interval
    await harness.stop(replica)
    await harness.clock.advance(30)  # down for half a minute, no due time missed
    replica = await harness.start()
    job_after = await replica.stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job.job_id))
    assert (job_after.name, job_after.schedule, job_after.created_at) == (job.name, job.schedule, job.created_at)
    assert job_after.next_run_at == T0 + 1200  # the phase survived the restart
    await harness.tick(1200 - 870, step=30)
    runs = await replica.runs_until(job.job_id, lambda r: len(r) == 2 and r[1].status == "succeeded")
    assert [r.scheduled_for for r in runs] == [T0 + 600, T0 + 1200]
    assert runs[1].trigger == "schedule"
    assert len(gateway.calls) == 2


async def test_missed_runs_after_downtime_run_once(harness, gateway):
    replica = await harness.start()
    job = await replica.create(name="n", schedule="hourly :00", prompt="p")  # missed policy run_once (default)
    await harness.stop(replica)
    await harness.clock.advance(5 * HOUR + 600)  # down across five due times
    replica = await harness.start()
    (run,) = await replica.runs_until(job.job_id, lambda r: len(r) == 1 and r[0].status == "succeeded")
    assert run.trigger == "catch_up"
    assert run.scheduled_for == T0 + 5 * HOUR  # the latest missed due time, run once
    assert run.started_at == T0 + 5 * HOUR + 600
    assert len(gateway.calls) == 1
    latest = await replica.stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job.job_id))
    assert latest.next_run_at == T0 + 6 * HOUR
    await harness.tick(HOUR - 600, step=300)  # then back on the normal timetable
    runs = await replica.runs_until(job.job_id, lambda r: len(r) == 2 and r[1].status == "succeeded")
    assert runs[1].trigger == "schedule" and runs[1].scheduled_for == T0 + 6 * HOUR


async def test_missed_runs_after_downtime_skip(harness, gateway):
    replica = await harness.start()
    job = await replica.create(name="n", schedule="hourly :00", prompt="p", missed_run_policy="skip")
    await harness.stop(replica)
    await harness.clock.advance(5 * HOUR + 600)
    replica = await harness.start()
    (skipped,) = await replica.runs_until(job.job_id, lambda r: len(r) == 1)
    assert skipped.status == "skipped" and "missed-run policy skip" in skipped.error
    assert gateway.calls == []
    latest = await replica.stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job.job_id))
    assert latest.next_run_at == T0 + 6 * HOUR and latest.last_run_at == 0
    await harness.tick(HOUR - 600, step=300)
    runs = await replica.runs_until(job.job_id, lambda r: len(r) == 2 and r[1].status == "succeeded")
    assert runs[1].trigger == "schedule" and len(gateway.calls) == 1


async def test_a_run_late_within_grace_is_not_missed(harness, gateway):
    replica = await harness.start()
    job = await replica.create(name="n", schedule="hourly :00", prompt="p", missed_run_policy="skip")
    await harness.stop(replica)
    await harness.clock.advance(HOUR + 30)  # 30 s late, under the 60 s misfire grace
    replica = await harness.start()
    (run,) = await replica.runs_until(job.job_id, lambda r: len(r) == 1 and r[0].status == "succeeded")
    assert run.trigger == "schedule" and run.scheduled_for == T0 + HOUR


async def test_long_run_with_forbid_skips_overlapping_due_times(harness, gateway):
    gateway.hold = True
    replica = await harness.start()
    job = await replica.create(name="n", schedule="every 1m", prompt="p")  # forbid is the default
    await harness.clock.advance(60)
    await eventually(lambda: len(gateway.active) == 1, what="first run in flight")
    await harness.clock.advance(60)
    await harness.clock.advance(60)
    runs = await replica.runs_until(job.job_id, lambda r: len(r) == 3)
    assert [r.status for r in runs] == ["running", "skipped", "skipped"]
    assert all("concurrency policy forbid" in r.error for r in runs[1:])
    assert len(gateway.calls) == 1
    gateway.release_all()
    runs = await replica.runs_until(job.job_id, lambda r: r[0].status == "succeeded")
    await harness.clock.advance(60)  # once it is done, the schedule runs again
    runs = await replica.runs_until(job.job_id, lambda r: len(r) == 4 and r[3].status == "running")
    await eventually(lambda: len(gateway.calls) == 2, what="the next run to reach the gateway")
    gateway.release_all()


async def test_long_run_with_replace_cancels_the_old_one(harness, gateway):
    gateway.hold = True
    replica = await harness.start()
    job = await replica.create(name="n", schedule="every 1m", prompt="p", concurrency_policy="replace")
    await harness.clock.advance(60)
    await eventually(lambda: len(gateway.active) == 1, what="first run in flight")
    await harness.clock.advance(60)
    runs = await replica.runs_until(job.job_id, lambda r: len(r) == 2 and r[0].status == "cancelled")
    assert "replaced by run " + runs[1].run_id in runs[0].error
    # The second call reaches the gateway after its run is recorded as running: wait for it
    # (the first, cancelled call may still be leaving `active`).
    await eventually(lambda: len(gateway.calls) == 2 and len(gateway.active) == 1, what="second run in flight")
    assert runs[1].status == "running"
    gateway.release_all()
    runs = await replica.runs_until(job.job_id, lambda r: r[1].status == "succeeded")


async def test_long_run_with_allow_overlaps(harness, gateway):
    gateway.hold = True
    replica = await harness.start()
    job = await replica.create(name="n", schedule="every 1m", prompt="p", concurrency_policy="allow")
    for expected in (1, 2, 3):
        await harness.clock.advance(60)
        await eventually(lambda e=expected: len(gateway.active) == e, what=f"{expected} runs in flight")
    gateway.release_all()
    runs = await replica.runs_until(job.job_id, lambda r: len(r) == 3 and all(x.status == "succeeded" for x in r))
    assert len({r.session_id for r in runs}) == 3


async def test_manual_trigger_respects_forbid(harness, gateway):
    gateway.hold = True
    replica = await harness.start()
    job = await replica.create(name="n", schedule="daily 09:00", prompt="p")
    await replica.stub.TriggerJob(scheduler_pb2.TriggerJobRequest(job_id=job.job_id))
    await eventually(lambda: len(gateway.active) == 1, what="run in flight")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await replica.stub.TriggerJob(scheduler_pb2.TriggerJobRequest(job_id=job.job_id))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "still running" in info.value.details()
    gateway.release_all()
    await replica.settled(job.job_id)


async def test_shutdown_cancels_a_run_that_outlives_the_drain(harness, gateway):
    gateway.hold = True
    replica = await harness.start()
    job = await replica.create(name="n", schedule="every 1m", prompt="p")
    await harness.clock.advance(60)
    await eventually(lambda: len(gateway.active) == 1, what="run in flight")
    await harness.stop(replica)
    replica = await harness.start()
    (run,) = await replica.runs(job.job_id)
    assert run.status == "cancelled" and "scheduler stopped" in run.error


async def test_startup_jobs_fire_when_a_scheduler_starts(harness, gateway):
    replica = await harness.start()
    job = await replica.create(name="warm up", schedule="startup", prompt="load the caches")
    assert job.next_run_at == 0
    await harness.tick(HOUR, step=600)
    assert await replica.runs(job.job_id) == []  # never on the clock
    await harness.stop(replica)
    await harness.clock.advance(10)
    replica = await harness.start()
    (run,) = await replica.runs_until(job.job_id, lambda r: len(r) == 1 and r[0].status == "succeeded")
    assert run.trigger == "startup" and run.scheduled_for == T0 + HOUR + 10


async def test_daily_job_in_a_timezone_across_spring_forward(harness, gateway):
    new_york = ZoneInfo("America/New_York")
    await harness.clock.set(datetime(2026, 3, 6, 12, 0, tzinfo=new_york).timestamp())
    replica = await harness.start()
    job = await replica.create(name="n", schedule="daily 02:30", prompt="p", timezone="America/New_York")
    await harness.tick(3 * 86400, step=1800)
    runs = await replica.runs_until(job.job_id, lambda r: len(r) == 3 and all(x.status == "succeeded" for x in r))
    fired = [datetime.fromtimestamp(r.scheduled_for, new_york) for r in runs]
    assert [(d.day, d.hour, d.minute) for d in fired] == [(7, 2, 30), (8, 3, 0), (9, 2, 30)]
    assert all(r.trigger == "schedule" for r in runs)


async def test_daily_job_in_a_timezone_across_fall_back(harness, gateway):
    new_york = ZoneInfo("America/New_York")
    await harness.clock.set(datetime(2026, 10, 31, 12, 0, tzinfo=new_york).timestamp())
    replica = await harness.start()
    job = await replica.create(name="n", schedule="daily 01:30", prompt="p", timezone="America/New_York")
    await harness.tick(3 * 86400, step=1800)
    runs = await replica.runs_until(job.job_id, lambda r: len(r) == 3 and all(x.status == "succeeded" for x in r))
    fired = [datetime.fromtimestamp(r.scheduled_for, new_york) for r in runs]
    # 1 November: 01:30 happens twice (EDT, then EST); the job runs at the first only.
    assert [(d.day, d.hour, d.minute) for d in fired] == [(1, 1, 30), (2, 1, 30), (3, 1, 30)]
    assert fired[0].utcoffset().total_seconds() == -4 * 3600
    assert runs[1].scheduled_for - runs[0].scheduled_for == 25 * 3600
