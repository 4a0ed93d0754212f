"""`agentmesh cron add --at/--in` and `agentmesh cron apply` against a real scheduler.

The CLI reads the real time for `--in`, so here the scheduler's (fake) clock starts at the real
time: it still moves only when the test says so.
"""

from __future__ import annotations

import json
import time

import pytest

from agentmesh.cli.common import CliError
from agentmesh.cli.main import build_parser
from agentmesh.v1 import scheduler_pb2
from tests.scheduler.conftest import eventually
from tests.scheduler.fakes import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(time.time())


async def _jobs(replica) -> list[scheduler_pb2.Job]:
    return list((await replica.stub.ListJobs(scheduler_pb2.ListJobsRequest())).jobs)


async def test_a_job_added_with_in_fires_once_across_a_scheduler_restart(cli, capsys, harness, gateway):
    assert await cli("add", "--in", "5s", "water", "the", "plants") == 0
    job_id = capsys.readouterr().out.strip()
    (job,) = await _jobs(cli.replica)
    assert (job.job_id, job.name, job.prompt, job.schedule) == (job_id, "water the plants", "water the plants", "")
    assert job.run_at > harness.clock.now()

    await harness.stop(cli.replica)  # restarted between creation and firing
    replica = await harness.start()
    await harness.tick(10)
    (run,) = await replica.runs_until(job_id, lambda runs: len(runs) == 1 and runs[0].status == "succeeded",
                                      timeout=60)
    assert run.trigger == "schedule"
    await harness.tick(600, step=60)
    assert len(await replica.runs(job_id)) == 1
    assert [c.message for c in gateway.calls] == ["water the plants"]
    done = await replica.stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job_id))
    assert done.done_at > 0 and done.next_run_at == 0


async def test_add_at_takes_an_iso_time_in_the_timezone_and_list_shows_it(cli, capsys):
    year = time.gmtime().tm_year + 1
    when = f"{year}-01-01T09:00"  # no offset: wall time in --timezone
    assert await cli("add", "--at", when, "--timezone", "Europe/Berlin", "--name", "new year", "--prompt", "hi") == 0
    capsys.readouterr()
    (job,) = await _jobs(cli.replica)
    from datetime import datetime
    from zoneinfo import ZoneInfo

    assert job.run_at == datetime(year, 1, 1, 9, tzinfo=ZoneInfo("Europe/Berlin")).timestamp()
    assert await cli("list") == 0
    assert f"at {year}-01-01" in capsys.readouterr().out


async def test_bad_one_off_times_are_usage_errors_and_change_nothing(cli):
    for argv, says in [
        (("--at", "next tuesday", "m"), "not an ISO 8601 time"),
        (("--at", "2020-01-01T00:00Z", "m"), "in the past"),
        (("--at", f"{time.gmtime().tm_year + 3}-01-01T00:00Z", "m"), "at most 366 days"),
        (("--in", "2x", "m"), "a unit s, m, h or d"),
        (("--in", "0s", "m"), "at least 1 second"),
        (("--in", "400d", "m"), "at most 366 days"),
        (("--in", "1h", "--schedule", "every 1m", "m"), "exactly one of --schedule"),
        (("--in", "1h"), "the message is required"),
        (("--in", "1h", "--prompt", "a", "b"), "the message is required, once"),
    ]:
        with pytest.raises(CliError) as info:
            await cli("add", *argv)
        assert info.value.exit_code == 2 and says in str(info.value), argv
    assert not await _jobs(cli.replica)


async def test_apply_reconciles_its_jobs_and_is_idempotent(cli, capsys, tmp_path):
    mine = await cli.replica.create(name="mine", schedule="every 1h", prompt="made through the API")
    path = tmp_path / "team.yaml"
    path.write_text(
        "- name: digest\n  schedule: every 10m\n  message: send the digest\n  session: digests\n"
        "- name: cleanup\n  schedule: '0 3 * * *'\n  message: clean up\n  enabled: false\n"
    )
    assert await cli("apply", str(path)) == 0
    out = capsys.readouterr().out
    assert "added   digest" in out and "added   cleanup" in out and "2 added, 0 changed, 0 removed" in out
    jobs = {j.name: j for j in await _jobs(cli.replica)}
    assert jobs["digest"].source == "apply:team.yaml" and jobs["cleanup"].enabled is False
    assert jobs["mine"].source == ""

    assert await cli("apply", str(path)) == 0
    assert capsys.readouterr().out.strip() == f"applied {path}: nothing changed"

    path.write_text(json.dumps([{"name": "digest", "schedule": "every 30m", "message": "send the digest",
                                 "session": "digests"}]))
    assert await cli("apply", str(path)) == 0
    out = capsys.readouterr().out
    assert "changed digest" in out and "schedule" in out and "removed cleanup" in out
    assert "0 added, 1 changed, 1 removed" in out
    jobs = {j.name: j for j in await _jobs(cli.replica)}
    assert set(jobs) == {"mine", "digest"} and jobs["digest"].schedule == "every 30m"
    assert jobs["mine"].updated_at == mine.updated_at

    assert await cli("apply", str(path)) == 0
    assert "nothing changed" in capsys.readouterr().out


async def test_apply_refuses_a_bad_file_and_changes_nothing(cli, tmp_path):
    path = tmp_path / "jobs.json"
    path.write_text(json.dumps([{"name": "ok", "schedule": "every 1m", "message": "p"},
                                {"name": "bad", "schedule": "every fortnight", "message": "p"}]))
    with pytest.raises(CliError) as info:
        await cli("apply", str(path))
    assert info.value.exit_code == 2 and "job 2 ('bad'): schedule" in str(info.value)
    assert "nothing was changed" in str(info.value)
    path.write_text(json.dumps([{"name": "late", "at": "2020-01-01T00:00Z", "message": "p"}]))
    with pytest.raises(CliError) as info:
        await cli("apply", str(path))
    assert info.value.exit_code == 2 and "in the past" in str(info.value)
    assert not await _jobs(cli.replica)


async def test_list_shows_the_watched_file_and_why_it_was_not_applied(harness, monkeypatch, logs_to_stderr, capsys,
                                                                      tmp_path):
    path = tmp_path / "jobs.json"
    path.write_text("[{")
    replica = await harness.start({"AGENTMESH_SCHEDULER_JOBS_FILE": str(path),
                                   "AGENTMESH_SCHEDULER_JOBS_FILE_POLL_S": "0.05"})
    monkeypatch.setenv("AGENTMESH_SCHEDULER_ADDR", replica.host.target)
    monkeypatch.delenv("AGENTMESH_AUTH_TOKEN", raising=False)

    async def listed(says: str) -> bool:
        args = build_parser().parse_args(["cron", "list"])
        assert await args.func(args) == 0
        return says in capsys.readouterr().out

    await eventually(lambda: listed(f"jobs file {path}: NOT APPLIED, the jobs stay as they were: jobs.json is not "
                                    "valid JSON"), timeout=30, what="the refusal in cron list")
    path.write_text(json.dumps([{"name": "digest", "schedule": "every 10m", "message": "m"}]))
    await eventually(lambda: listed(f"jobs file {path}: 1 jobs, applied"), timeout=30, what="the applied file")
