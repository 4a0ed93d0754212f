"""Two scheduler replicas on one data directory: one fires, the other stands by and takes over,
and not even two instances that both believe they lead can fire a due time twice."""

from __future__ import annotations

import asyncio

from agentmesh.scheduler.model import Job, Run
from agentmesh.scheduler.store import SqliteStore
from agentmesh.v1 import scheduler_pb2
from tests.scheduler.conftest import T0, eventually


class AlwaysLeader:
    """A lock that says yes to everyone: the worst case a lease handover could produce."""

    async def acquire(self, now: float) -> bool:
        return True

    async def release(self) -> None:
        pass


async def test_two_replicas_one_fires(harness, gateway):
    first = await harness.start()
    second = await harness.start(wait_leader=False)
    await harness.tick(10, step=5)  # a few leadership rounds
    assert first.core.is_leader and not second.core.is_leader
    # Jobs created through the standby are fired by the leader: they share the store.
    job = await second.create(name="n", schedule="every 1m", prompt="p")
    assert (await first.stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job.job_id))).name == "n"
    await harness.tick(300, step=10)
    runs = await first.runs_until(job.job_id, lambda r: len(r) == 5 and all(x.status == "succeeded" for x in r))
    assert [r.scheduled_for for r in runs] == [job.created_at + 60 * k for k in range(1, 6)]
    assert len(gateway.calls) == 5


async def test_standby_takes_over_when_the_leader_stops(harness, gateway):
    first = await harness.start()
    second = await harness.start(wait_leader=False)
    job = await first.create(name="n", schedule="every 1m", prompt="p")
    await harness.tick(120, step=10)
    await harness.stop(first)
    await harness.tick(60, step=5)  # within one renew interval the standby leads
    assert second.core.is_leader
    await harness.tick(120, step=10)
    runs = await second.runs_until(job.job_id, lambda r: len(r) == 5 and all(x.status == "succeeded" for x in r))
    assert [r.scheduled_for for r in runs] == [T0 + 60 * k for k in range(1, 6)]
    assert len(gateway.calls) == 5  # no due time lost, none doubled


async def test_two_leaders_at_once_still_fire_each_due_time_once(harness, gateway):
    first = await harness.start(lock=AlwaysLeader())
    second = await harness.start(lock=AlwaysLeader())
    assert first.core.is_leader and second.core.is_leader
    jobs = [await first.create(name=f"j{i}", schedule="every 1m", prompt="p", concurrency_policy="allow")
            for i in range(5)]
    await harness.tick(600, step=30)
    for job in jobs:
        runs = await first.runs_until(job.job_id, lambda r: len(r) == 10 and all(x.status == "succeeded" for x in r))
        assert sorted(r.scheduled_for for r in runs) == [T0 + 60 * k for k in range(1, 11)]
    assert len(gateway.calls) == 50


async def test_a_crashed_instances_runs_end_as_failed(tmp_path, harness, gateway):
    # A run left 'running' by an instance that no longer heart-beats (it crashed).
    store = SqliteStore(tmp_path / "home" / "scheduler" / "scheduler.db")
    await store.create_job(Job(job_id="j", name="n", schedule="every 1h", prompt="p", created_at=T0, anchor_at=T0,
                               next_run_at=T0 + 3600))
    await store.heartbeat("dead-instance", T0 - 600)
    await store.insert_run(Run(run_id="r1", job_id="j", status="running", scheduled_for=T0 - 700,
                               started_at=T0 - 700, owner="dead-instance"), last_run_at=T0 - 700)
    await store.close()
    replica = await harness.start()
    (run,) = await replica.runs_until("j", lambda r: r[0].status != "running")
    assert run.status == "failed" and "stopped before the run finished" in run.error


async def test_store_claim_is_idempotent_across_connections(tmp_path):
    path = tmp_path / "scheduler.db"
    a, b = SqliteStore(path), SqliteStore(path)
    try:
        await a.create_job(Job(job_id="j", name="n", schedule="every 1m", prompt="p", next_run_at=T0 + 60))

        def run(run_id: str) -> Run:
            return Run(run_id=run_id, job_id="j", status="running", scheduled_for=T0 + 60, started_at=T0 + 60)

        results = await asyncio.gather(*(store.claim("j", T0 + 60, T0 + 120, run(f"r{i}"))
                                         for i, store in enumerate([a, b, a, b])))
        assert sorted(results) == [False, False, False, True]
        assert len(await a.list_runs("j", 10)) == 1
        # Even if the job were moved back (a stale writer), the due time cannot be taken twice.
        assert not await b.claim("j", T0 + 120, T0 + 180, run("late"))
        await a.put_job(Job(job_id="j", name="n", schedule="every 1m", prompt="p", next_run_at=T0 + 60))
        assert not await b.claim("j", T0 + 60, T0 + 120, run("again"))
        assert len(await a.list_runs("j", 10)) == 1
        # ...and the job moved on past it, so it is not due again and again.
        assert (await a.get_job("j")).next_run_at == T0 + 120
    finally:
        await a.close()
        await b.close()


async def test_leadership_needs_the_lock_not_just_a_start(harness):
    first = await harness.start()
    second = await harness.start(wait_leader=False)
    await harness.tick(30, step=5)
    await eventually(lambda: first.core.is_leader and not second.core.is_leader, what="one leader")


async def test_replace_reaches_a_run_on_the_other_replica_through_the_gateway(harness, gateway):
    gateway.hold = True
    leader = await harness.start()
    standby = await harness.start(wait_leader=False)
    job = await leader.create(name="n", schedule="every 1m", prompt="p", concurrency_policy="replace")
    await harness.clock.advance(60)
    await eventually(lambda: len(gateway.active) == 1, what="the leader's run in flight")
    # A manual run through the standby replaces the leader's run: the standby cannot touch the
    # leader's task, so it asks the gateway to cancel that session's turn.
    await standby.stub.TriggerJob(scheduler_pb2.TriggerJobRequest(job_id=job.job_id))
    def by_trigger(runs):
        return {r.trigger: r for r in runs}

    runs = await standby.runs_until(
        job.job_id, lambda r: len(r) == 2 and by_trigger(r)["schedule"].status == "cancelled")
    assert gateway.cancelled == [by_trigger(runs)["schedule"].session_id]
    await eventually(lambda: len(gateway.calls) == 2, what="the manual run to reach the gateway")
    gateway.release_all()
    await standby.runs_until(job.job_id, lambda r: by_trigger(r)["manual"].status == "succeeded")
