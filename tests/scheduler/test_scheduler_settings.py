"""Scheduler settings from the environment, and the limits they set."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3

import grpc
import pytest

from agentmesh.config import ConfigError
from agentmesh.rpc.identity import ServiceIdentity
from agentmesh.scheduler.settings import SchedulerSettings
from agentmesh.scheduler.store import SqliteStore
from agentmesh.v1 import scheduler_pb2
from tests.scheduler.conftest import eventually


def test_defaults_and_overrides():
    assert SchedulerSettings.from_env({}).lock == "file"
    settings = SchedulerSettings.from_env({
        "AGENTMESH_SCHEDULER_LOCK": "lease", "AGENTMESH_SCHEDULER_LEASE_NAME": "sched",
        "AGENTMESH_SCHEDULER_NAMESPACE": "agents", "AGENTMESH_SCHEDULER_JOURNAL": "delete",
    })
    assert (settings.lock, settings.lease_name, settings.namespace, settings.journal_mode) == (
        "lease", "sched", "agents", "delete")


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"AGENTMESH_SCHEDULER_LOCK": "redis"}, "AGENTMESH_SCHEDULER_LOCK must be one of file, lease"),
        ({"AGENTMESH_SCHEDULER_RENEW_S": "20"}, "must be longer than AGENTMESH_SCHEDULER_RENEW_S"),
        ({"AGENTMESH_SCHEDULER_POLL_S": "soon"}, "AGENTMESH_SCHEDULER_POLL_S must be a number"),
        ({"AGENTMESH_SCHEDULER_HISTORY_LIMIT": "0"}, "at least 1"),
    ],
)
def test_bad_settings_name_the_variable(env, says):
    with pytest.raises(ConfigError, match=says):
        SchedulerSettings.from_env(env)


async def test_job_count_limit(harness):
    replica = await harness.start({"AGENTMESH_SCHEDULER_MAX_JOBS": "2"})
    for i in range(2):
        await replica.create(name=f"n{i}", schedule="every 1h", prompt="p")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await replica.create(name="one too many", schedule="every 1h", prompt="p")
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "maximum of 2 jobs" in info.value.details()


async def test_runs_reach_the_gateway_under_the_schedulers_identity(harness, gateway):
    replica = await harness.start({"AGENTMESH_AUTH_TOKEN": "tok-0123456789"})
    job = await replica.create(name="n", schedule="every 1h", prompt="p")
    await replica.stub.TriggerJob(scheduler_pb2.TriggerJobRequest(job_id=job.job_id))
    await replica.settled(job.job_id)
    # Not a user's token: a token the scheduler signed for the gateway, which the gateway's key checks.
    assert gateway.authorization == [""]
    principal = ServiceIdentity.open("gateway", harness.settings().keys_dir).verify(gateway.service_tokens[0])
    # ...on behalf of whoever created the job: here a user, with authentication off.
    assert principal.via == "scheduler" and principal.subject == "user:anonymous"


async def test_timed_runs_are_made_on_behalf_of_the_jobs_creator(harness, gateway):
    token = "tok-creator-0123456789"
    replica = await harness.start({"AGENTMESH_AUTH_TOKENS": token})
    user = (("authorization", f"Bearer {token}"),)
    await replica.stub.CreateJob(scheduler_pb2.CreateJobRequest(
        job=scheduler_pb2.Job(name="n", schedule="every 1h", prompt="p")), metadata=user)
    await harness.clock.advance(3600)
    await eventually(lambda: gateway.service_tokens, what="the timed run to reach the gateway")
    principal = ServiceIdentity.open("gateway", harness.settings().keys_dir).verify(gateway.service_tokens[0])
    assert principal.via == "scheduler"
    assert principal.subject == "user:" + hashlib.sha256(token.encode()).hexdigest()[:12]


def test_a_database_from_before_job_owners_gains_the_columns(tmp_path):
    path = tmp_path / "scheduler.db"
    old = sqlite3.connect(path)
    old.execute("CREATE TABLE jobs (job_id TEXT PRIMARY KEY, name TEXT NOT NULL, schedule TEXT NOT NULL, "
                "prompt TEXT NOT NULL, session_id TEXT NOT NULL, mode TEXT NOT NULL, enabled INTEGER NOT NULL, "
                "timezone TEXT NOT NULL, concurrency_policy TEXT NOT NULL, missed_run_policy TEXT NOT NULL, "
                "created_at REAL NOT NULL, updated_at REAL NOT NULL, anchor_at REAL NOT NULL, "
                "next_run_at REAL NOT NULL, last_run_at REAL NOT NULL)")
    old.execute("INSERT INTO jobs VALUES ('job-1', 'n', 'every 1h', 'p', '', '', 1, 'UTC', 'forbid', 'run_once', "
                "1, 1, 1, 3601, 0)")
    old.commit()
    old.close()
    store = SqliteStore(path)
    job = asyncio.run(store.get_job("job-1"))
    asyncio.run(store.close())
    assert job is not None and job.prompt == "p" and job.created_by == ""
