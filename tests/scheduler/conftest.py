"""Scheduler replicas on real ports, driven by a fake clock, running turns on a fake Gateway.

    async def test_x(harness):
        replica = await harness.start()            # leader once `await harness.leader(replica)`
        job = await replica.create(name="n", schedule="every 10m", prompt="hi")
        await harness.clock.advance(600)
        runs = await replica.runs_until(job.job_id, lambda runs: len(runs) == 1)
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Callable, Mapping

import pytest
import structlog

from agentmesh.cli.main import build_parser
from agentmesh.config import Settings
from agentmesh.rpc.client import open_channel
from agentmesh.scheduler.server import build
from agentmesh.telemetry import setup_telemetry
from agentmesh.v1 import scheduler_pb2, scheduler_pb2_grpc
from tests.scheduler.fakes import FakeClock, FakeGateway
from tests.support.timing import PATIENCE_S

# Monday 5 January 2026, 00:00 UTC: a round start makes due times easy to read.
T0 = datetime(2026, 1, 5, tzinfo=UTC).timestamp()

BASE_ENV = {
    "AGENTMESH_TRACES": "local",
    "AGENTMESH_DRAIN_S": "1",
    "AGENTMESH_SCHEDULER_POLL_S": "1",
    "AGENTMESH_SCHEDULER_RENEW_S": "5",
    "AGENTMESH_SCHEDULER_LEASE_DURATION_S": "15",
    "AGENTMESH_SCHEDULER_MISFIRE_GRACE_S": "60",
    "PATH": "/usr/bin:/bin",
}


async def eventually(check: Callable[[], Any], timeout: float = PATIENCE_S, what: str = "condition"):
    """Poll `check` (sync or async) until it returns something truthy; fail after `timeout` s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


class Replica:
    def __init__(self, host, clock: FakeClock):
        self.host = host
        self.core = host.scheduler
        self.clock = clock
        self.channel = open_channel(host.target)
        self.stub = scheduler_pb2_grpc.SchedulerStub(self.channel)

    async def create(self, **fields) -> scheduler_pb2.Job:
        return await self.stub.CreateJob(scheduler_pb2.CreateJobRequest(job=scheduler_pb2.Job(**fields)))

    async def runs(self, job_id: str = "", limit: int = 500) -> list[scheduler_pb2.JobRun]:
        response = await self.stub.ListRuns(scheduler_pb2.ListRunsRequest(job_id=job_id, limit=limit))
        return list(reversed(response.runs))  # oldest first reads better in assertions

    async def runs_until(self, job_id: str, predicate: Callable[[list], bool], timeout: float = PATIENCE_S):
        async def check():
            runs = await self.runs(job_id)
            return runs if predicate(runs) else None

        return await eventually(check, timeout, what=f"runs of {job_id} to match")

    async def settled(self, job_id: str) -> list[scheduler_pb2.JobRun]:
        """The job's runs once none of them is still running."""
        return await self.runs_until(job_id, lambda runs: all(r.status != "running" for r in runs))

    async def stop(self) -> None:
        await self.channel.close()
        await self.host.stop(grace=0.5)
        self.host.telemetry.shutdown()


class Harness:
    def __init__(self, home: Path, gateway: FakeGateway, clock: FakeClock):
        self.home = home
        self.gateway = gateway
        self.clock = clock
        self.replicas: list[Replica] = []

    def settings(self, env: Mapping[str, str] | None = None) -> Settings:
        base = Settings.from_env({"AGENTMESH_HOME": str(self.home), **BASE_ENV, **(env or {})})
        return dataclasses.replace(base, addresses={**base.addresses, "gateway": self.gateway.target})

    async def start(self, env: Mapping[str, str] | None = None, *, lock=None, wait_leader: bool = True) -> Replica:
        settings = self.settings(env)
        host = await build(settings, setup_telemetry("scheduler", settings), "127.0.0.1:0", clock=self.clock, lock=lock)
        await host.start()
        replica = Replica(host, self.clock)
        self.replicas.append(replica)
        if wait_leader:
            await self.leader(replica)
        return replica

    async def leader(self, replica: Replica) -> None:
        await eventually(lambda: replica.core.is_leader, what="leadership")
        # Let the firing loop see leadership and go to sleep on the clock.
        for _ in range(20):
            await asyncio.sleep(0)

    async def stop(self, replica: Replica) -> None:
        self.replicas.remove(replica)
        await replica.stop()

    def quiet(self) -> bool:
        """Every loop asleep on the clock, and every run either done or held by the gateway."""
        loops = sum(1 + r.core.is_leader for r in self.replicas)
        runs = sum(r.core.active_runs for r in self.replicas)
        return self.clock.sleepers >= loops and runs <= len(self.gateway.active)

    async def tick(self, seconds: float, step: float = 1.0) -> None:
        """Move the clock forward in steps, letting the scheduler finish its work at each one,
        as if it had all the real time in the world (normal running)."""
        moved = 0.0
        while moved < seconds:
            delta = min(step, seconds - moved)
            await self.clock.advance(delta)
            moved += delta
            await eventually(self.quiet, what="the scheduler to settle")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
async def gateway():
    async with FakeGateway() as fake:
        yield fake


@pytest.fixture
async def harness(tmp_path, gateway, clock):
    h = Harness(tmp_path / "home", gateway, clock)
    yield h
    gateway.release_all()
    for replica in list(h.replicas):
        await h.stop(replica)


@pytest.fixture
def logs_to_stderr():
    """The scheduler logs in this process too; keep stdout for what the command prints."""
    saved = structlog.get_config()
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))
    yield
    structlog.configure(**saved)


@pytest.fixture
async def cli(harness, monkeypatch, logs_to_stderr):
    replica = await harness.start()
    monkeypatch.setenv("AGENTMESH_SCHEDULER_ADDR", replica.host.target)
    monkeypatch.delenv("AGENTMESH_AUTH_TOKEN", raising=False)

    async def run(*argv: str) -> int:
        args = build_parser().parse_args(["cron", *argv])
        return await args.func(args)

    run.replica = replica
    return run
