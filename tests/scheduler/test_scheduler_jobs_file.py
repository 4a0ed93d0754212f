"""The watched jobs file (AGENTMESH_SCHEDULER_JOBS_FILE) over real gRPC: edits to the file add,
change and remove its jobs; API-made jobs are left alone; a broken file changes nothing and is
reported in ListJobs; the API may not edit or delete the file's jobs."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from agentmesh.v1 import scheduler_pb2
from tests.scheduler.conftest import T0, eventually
from tests.scheduler.test_scheduler_replicas import AlwaysLeader


def _env(path: Path) -> dict[str, str]:
    return {"AGENTMESH_SCHEDULER_JOBS_FILE": str(path), "AGENTMESH_SCHEDULER_JOBS_FILE_POLL_S": "0.05"}


def _write(path: Path, jobs) -> None:
    # Write then rename, as an editor or a ConfigMap update does: the watcher never sees half a file.
    partial = path.with_suffix(".partial")
    partial.write_text(jobs if isinstance(jobs, str) else json.dumps(jobs))
    partial.replace(path)


async def _listing(replica) -> scheduler_pb2.ListJobsResponse:
    return await replica.stub.ListJobs(scheduler_pb2.ListJobsRequest())


async def _file_jobs_until(replica, predicate, what: str) -> dict[str, scheduler_pb2.Job]:
    async def check():
        jobs = {j.name: j for j in (await _listing(replica)).jobs if j.source.startswith("file:")}
        return [jobs] if predicate(jobs) else None  # wrapped: no jobs at all is an answer too

    (jobs,) = await eventually(check, timeout=30, what=what)
    return jobs


async def test_editing_the_file_adds_changes_and_removes_its_jobs_only(harness, gateway, tmp_path):
    path = tmp_path / "jobs.json"
    _write(path, [
        {"name": "digest", "schedule": "every 10m", "message": "send the digest", "session": "digests"},
        {"name": "cleanup", "schedule": "0 3 * * *", "message": "clean up", "enabled": False},
    ])
    replica = await harness.start(_env(path))
    mine = await replica.create(name="mine", schedule="every 1h", prompt="made through the API")

    jobs = await _file_jobs_until(replica, lambda jobs: set(jobs) == {"digest", "cleanup"}, "the file's jobs")
    digest = jobs["digest"]
    assert (digest.source, digest.prompt, digest.session_id, digest.schedule) == (
        f"file:{path}", "send the digest", "digests", "every 10m")
    assert jobs["cleanup"].enabled is False
    status = (await _listing(replica)).jobs_file
    assert (status.path, status.ok, status.jobs) == (str(path), True, 2)

    await harness.tick(600, step=60)  # a file job fires like any other
    (run,) = await replica.settled(digest.job_id)
    assert run.status == "succeeded" and run.session_id == "digests"

    _write(path, [
        {"name": "digest", "schedule": "every 30m", "message": "send the digest", "session": "digests"},
        {"name": "reminder", "at": "2026-01-05T02:00Z", "message": "one reminder"},
    ])
    jobs = await _file_jobs_until(replica, lambda jobs: set(jobs) == {"digest", "reminder"}, "the edit")
    assert jobs["digest"].job_id == digest.job_id and jobs["digest"].schedule == "every 30m"
    assert jobs["reminder"].run_at == T0 + 7200 and jobs["reminder"].schedule == ""
    assert len(await replica.runs(digest.job_id)) == 1  # a changed job keeps its history

    untouched = (await replica.stub.GetJob(scheduler_pb2.GetJobRequest(job_id=mine.job_id)))
    assert (untouched.source, untouched.updated_at, untouched.prompt) == ("", mine.updated_at, "made through the API")

    _write(path, {"jobs": []})
    await _file_jobs_until(replica, lambda jobs: not jobs, "the file's jobs to be removed")
    assert [j.job_id for j in (await _listing(replica)).jobs] == [mine.job_id]


async def test_a_broken_file_changes_nothing_and_is_reported(harness, tmp_path):
    path = tmp_path / "jobs.json"
    good = [{"name": "digest", "schedule": "every 10m", "message": "send the digest"}]
    _write(path, good)
    replica = await harness.start(_env(path))
    (before,) = (await _file_jobs_until(replica, lambda jobs: len(jobs) == 1, "the file's job")).values()

    for broken, says in [
        ([{"name": "digest", "schedule": "every fortnight", "message": "x"}], "job 1 ('digest'): schedule"),
        ("[{not json", "is not valid JSON"),
        ([{"name": "a", "schedule": "every 1m", "message": "x"}, {"name": "a", "schedule": "every 2m", "message": "y"}],
         "used twice"),
        ([{"name": "late", "at": "2025-12-01T09:00Z", "message": "x"}], "in the past"),
        ([{"name": "typo", "shedule": "every 1m", "message": "x"}], "unknown key 'shedule'"),
    ]:
        _write(path, broken)

        async def refused(says=says):
            status = (await _listing(replica)).jobs_file
            return not status.ok and says in status.error

        await eventually(refused, timeout=30, what=f"the file to be refused with {says!r}")
        (job,) = (await _listing(replica)).jobs
        assert (job.job_id, job.schedule, job.updated_at) == (before.job_id, "every 10m", before.updated_at)

    path.unlink()
    await eventually(lambda: _refused_with(replica, "cannot read"), timeout=30, what="a missing file refused")
    assert len((await _listing(replica)).jobs) == 1

    good[0]["message"] = "send the digest, shorter"
    _write(path, good)
    jobs = await _file_jobs_until(replica, lambda jobs: jobs["digest"].prompt.endswith("shorter"), "the fix")
    assert jobs["digest"].job_id == before.job_id and (await _listing(replica)).jobs_file.ok


async def _refused_with(replica, says: str) -> bool:
    status = (await _listing(replica)).jobs_file
    return not status.ok and says in status.error


async def test_yaml_file_with_a_one_off_job_fires_it_once(harness, gateway, tmp_path):
    path = tmp_path / "jobs.yaml"
    # Unquoted, YAML reads the time as a datetime: it is taken as the time it names.
    _write(path, "jobs:\n  - name: once\n    at: 2026-01-05T00:01:00Z\n    message: just once\n")
    replica = await harness.start(_env(path))
    (job,) = (await _file_jobs_until(replica, lambda jobs: "once" in jobs, "the YAML job")).values()
    assert job.run_at == T0 + 60
    await harness.tick(600, step=30)
    (run,) = await replica.settled(job.job_id)
    assert run.status == "succeeded"
    done = await replica.stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job.job_id))
    assert done.done_at > 0
    assert (await _listing(replica)).jobs_file.ok  # a past `at` of a job already there is no error


async def test_the_api_may_run_but_not_edit_or_delete_a_file_job(harness, gateway, tmp_path):
    path = tmp_path / "jobs.json"
    _write(path, [{"name": "digest", "schedule": "every 10m", "message": "send the digest"}])
    replica = await harness.start(_env(path))
    (job,) = (await _file_jobs_until(replica, lambda jobs: len(jobs) == 1, "the file's job")).values()
    for call, request in [
        ("UpdateJob", scheduler_pb2.UpdateJobRequest(job=scheduler_pb2.Job(job_id=job.job_id, prompt="x"))),
        ("ToggleJob", scheduler_pb2.ToggleJobRequest(job_id=job.job_id)),
        ("DeleteJob", scheduler_pb2.DeleteJobRequest(job_id=job.job_id)),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await getattr(replica.stub, call)(request)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "declared in the jobs file" in info.value.details()
    run = await replica.stub.TriggerJob(scheduler_pb2.TriggerJobRequest(job_id=job.job_id))
    assert run.trigger == "manual"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await replica.create(name="sneaky", schedule="every 1m", prompt="p", source=f"file:{path}")
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "cannot be set" in info.value.details()


async def test_jobs_of_a_file_no_longer_watched_can_be_cleaned_up(harness, tmp_path):
    path = tmp_path / "jobs.json"
    _write(path, [{"name": "digest", "schedule": "every 10m", "message": "send the digest"}])
    first = await harness.start(_env(path))
    (job,) = (await _file_jobs_until(first, lambda jobs: len(jobs) == 1, "the file's job")).values()
    await harness.stop(first)
    second = await harness.start()  # AGENTMESH_SCHEDULER_JOBS_FILE no longer set
    listing = await _listing(second)
    assert [j.job_id for j in listing.jobs] == [job.job_id] and not listing.HasField("jobs_file")
    assert (await second.stub.DeleteJob(scheduler_pb2.DeleteJobRequest(job_id=job.job_id))).deleted


async def test_two_leaders_at_once_declare_each_job_once_and_fire_a_one_off_once(harness, gateway, tmp_path):
    # The worst case a lease handover could produce: both instances reconcile the same file.
    path = tmp_path / "jobs.json"
    _write(path, [{"name": f"j{i}", "schedule": "every 10m", "message": "m"} for i in range(5)]
           + [{"name": "once", "at": "2026-01-05T00:02:00Z", "message": "just once"}])
    first = await harness.start(_env(path), lock=AlwaysLeader())
    second = await harness.start(_env(path), lock=AlwaysLeader())
    assert first.core.is_leader and second.core.is_leader

    for replica in (first, second):
        await eventually(lambda replica=replica: _applied(replica), timeout=30, what="both to apply the file")
    jobs = await _file_jobs_until(first, lambda jobs: len(jobs) == 6, "the file's jobs")
    assert len((await _listing(first)).jobs) == 6  # no job twice

    await harness.tick(180, step=30)
    (run,) = await first.runs_until(jobs["once"].job_id, lambda runs: len(runs) == 1 and runs[0].status != "running")
    assert run.status == "succeeded"
    await harness.tick(120, step=30)
    assert len(await first.runs(jobs["once"].job_id)) == 1
    assert [c.message for c in gateway.calls].count("just once") == 1


async def _applied(replica) -> bool:
    return (await _listing(replica)).jobs_file.ok
