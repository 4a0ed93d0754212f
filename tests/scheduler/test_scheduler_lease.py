"""The Kubernetes Lease lock against a Lease API served by the test (see fake_kube.py)."""

from __future__ import annotations

import pytest

from agentmesh.scheduler.leader import LeaseLeaderLock
from tests.scheduler.conftest import T0
from tests.scheduler.fake_kube import FakeLeaseApi


@pytest.fixture
def kube():
    with FakeLeaseApi() as api:
        yield api


def lock(kube: FakeLeaseApi, identity: str, duration: float = 15) -> LeaseLeaderLock:
    return LeaseLeaderLock(kube.client(), "agents", "agentmesh-scheduler", identity, duration)


async def test_first_candidate_creates_the_lease_and_the_second_waits(kube):
    a, b = lock(kube, "pod-a"), lock(kube, "pod-b")
    assert await a.acquire(T0)
    assert not await b.acquire(T0 + 1)
    lease = kube.leases[("agents", "agentmesh-scheduler")]
    assert lease["spec"]["holderIdentity"] == "pod-a"
    assert lease["spec"]["leaseDurationSeconds"] == 15
    assert lease["spec"]["renewTime"].startswith("2026-01-05T00:00:00.")  # MicroTime, whole second or not
    # Renewals keep it; the standby keeps seeing a changing record and stays out.
    for t in range(5, 60, 5):
        assert await a.acquire(T0 + t)
        assert not await b.acquire(T0 + t + 1)
    assert kube.invalid == []


async def test_a_lease_not_renewed_for_its_duration_is_taken_over(kube):
    a, b = lock(kube, "pod-a"), lock(kube, "pod-b")
    assert await a.acquire(T0)
    assert not await b.acquire(T0 + 1)  # first sight of this record
    assert not await b.acquire(T0 + 10)  # unchanged for 9 s: still a live holder
    assert await b.acquire(T0 + 17)  # unchanged for 16 s > 15 s: presumed dead
    lease = kube.leases[("agents", "agentmesh-scheduler")]
    assert lease["spec"]["holderIdentity"] == "pod-b" and lease["spec"]["leaseTransitions"] == 1
    assert not await a.acquire(T0 + 18)  # the old holder finds it gone and steps down


async def test_release_hands_over_at_once(kube):
    a, b = lock(kube, "pod-a"), lock(kube, "pod-b")
    assert await a.acquire(T0)
    assert not await b.acquire(T0 + 1)
    await a.release()
    assert kube.leases[("agents", "agentmesh-scheduler")]["spec"]["holderIdentity"] == ""
    assert await b.acquire(T0 + 2)


async def test_only_get_create_and_update_are_used(kube):
    a, b = lock(kube, "pod-a"), lock(kube, "pod-b")
    for t in range(0, 40, 5):
        await a.acquire(T0 + t)
        await b.acquire(T0 + t)
    await a.release()
    await b.acquire(T0 + 41)
    await b.release()
    assert set(kube.verbs) <= {"GET", "POST", "PUT"}
    assert kube.invalid == []


async def test_api_outage_means_not_leader(kube):
    a = lock(kube, "pod-a")
    assert await a.acquire(T0)
    kube.down = True
    assert not await a.acquire(T0 + 5)
    kube.down = False
    assert await a.acquire(T0 + 10)


async def test_scheduler_replicas_on_a_lease_fire_once(harness, gateway, kube):
    first = await harness.start(lock=lock(kube, "pod-a"))
    second = await harness.start(lock=lock(kube, "pod-b"), wait_leader=False)
    job = await first.create(name="n", schedule="every 1m", prompt="p")
    await harness.tick(180, step=5)
    assert first.core.is_leader and not second.core.is_leader
    await harness.stop(first)  # releases the lease on the way out
    await harness.tick(180, step=5)
    assert second.core.is_leader
    runs = await second.runs_until(job.job_id, lambda r: len(r) == 6 and all(x.status == "succeeded" for x in r))
    assert [r.scheduled_for for r in runs] == [job.created_at + 60 * k for k in range(1, 7)]
    assert len(gateway.calls) == 6
