"""`agentmesh cron ...` against a real scheduler: handlers in-process, exit codes via the real command."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from agentmesh.cli.common import CliError
from agentmesh.v1 import scheduler_pb2


async def test_add_list_run_history_toggle_delete(cli, capsys, harness):
    assert await cli("add", "--name", "standup", "--schedule", "daily 09:00", "--prompt", "summarise yesterday",
                     "--timezone", "Europe/Berlin", "--session", "team", "--concurrency", "replace") == 0
    job_id = capsys.readouterr().out.strip()
    assert job_id.startswith("job-")

    assert await cli("list", "--json") == 0
    (job,) = json.loads(capsys.readouterr().out)
    assert (job["job_id"], job["timezone"], job["session_id"], job["concurrency_policy"], job["enabled"]) == (
        job_id, "Europe/Berlin", "team", "replace", True)
    assert await cli("list") == 0
    assert "standup" in capsys.readouterr().out

    assert await cli("run", job_id) == 0
    assert "started run run-" in capsys.readouterr().out
    await cli.replica.settled(job_id)
    assert await cli("history", job_id, "--json") == 0
    (run,) = json.loads(capsys.readouterr().out)
    assert run["status"] == "succeeded" and run["session_id"] == "team" and len(run["trace_id"]) == 32
    assert {"started_at", "finished_at"} <= run.keys()
    assert await cli("history", job_id) == 0
    assert "succeeded" in capsys.readouterr().out

    assert await cli("toggle", job_id) == 0
    assert capsys.readouterr().out.strip() == f"job {job_id} disabled"
    assert await cli("toggle", job_id) == 0
    assert "enabled; next run" in capsys.readouterr().out

    assert await cli("delete", job_id) == 0
    with pytest.raises(CliError) as info:
        await cli("delete", job_id)
    assert info.value.exit_code == 1 and "no job with id" in str(info.value)
    with pytest.raises(CliError) as info:
        await cli("run", "ghost")
    assert info.value.exit_code == 1 and "NOT_FOUND" in str(info.value)


async def test_add_names_the_agent_its_runs_talk_to(cli, capsys):
    assert await cli("add", "--schedule", "every 1h", "--agent", "reviewer@2", "review the merges") == 0
    job_id = capsys.readouterr().out.strip()
    assert await cli("list", "--json") == 0
    (job,) = json.loads(capsys.readouterr().out)
    assert (job["job_id"], job["agent"]) == (job_id, "reviewer@2")


async def test_bad_input_is_a_usage_error_before_the_server(cli):
    for argv, says in [
        (("add", "--name", "n", "--schedule", "0 0 30 2 *", "--prompt", "p"), "never matches a real date"),
        (("add", "--name", "n", "--schedule", "every 1m", "--prompt", "p", "--timezone", "Nowhere/Land"), "unknown"),
        (("add", "--name", "n", "--schedule", "every 1m", "--prompt", "p", "--session", "a b"), "malformed"),
        (("history", "x", "--limit", "0"), "--limit"),
    ]:
        with pytest.raises(CliError) as info:
            await cli(*argv)
        assert info.value.exit_code == 2 and says in str(info.value)
    assert not (await cli.replica.stub.ListJobs(scheduler_pb2.ListJobsRequest())).jobs


async def test_import_cron_json_creates_then_updates(cli, capsys, tmp_path):
    entries = [
        {"id": "morning", "name": "Morning brief", "schedule": "0 8 * * 1-5", "prompt": "brief me",
         "session_id": "brief", "enabled": True},
        {"id": "hourly-check", "name": "Check", "schedule": "every 1h", "prompt": "check", "session_id": None,
         "enabled": False},
        {"id": "boot", "schedule": "startup", "prompt": "say hello"},
    ]
    path = tmp_path / "cron.json"
    path.write_text(json.dumps(entries))
    assert await cli("import", str(path)) == 0
    assert "3 created, 0 updated" in capsys.readouterr().out
    await cli("list", "--json")
    jobs = {j["job_id"]: j for j in json.loads(capsys.readouterr().out)}
    assert set(jobs) == {"morning", "hourly-check", "boot"}
    assert jobs["morning"]["session_id"] == "brief" and jobs["morning"]["enabled"] is True
    assert jobs["hourly-check"]["enabled"] is False and jobs["hourly-check"]["session_id"] == ""
    assert jobs["boot"]["name"] == "boot"

    entries[0]["prompt"] = "brief me, shorter"
    path.write_text(json.dumps({"jobs": entries}))
    assert await cli("import", str(path)) == 0
    assert "0 created, 3 updated" in capsys.readouterr().out
    await cli("list", "--json")
    jobs = {j["job_id"]: j for j in json.loads(capsys.readouterr().out)}
    assert jobs["morning"]["prompt"] == "brief me, shorter"


async def test_import_refuses_a_bad_file_and_changes_nothing(cli, tmp_path):
    path = tmp_path / "cron.json"
    path.write_text(json.dumps([{"id": "ok", "schedule": "every 1m", "prompt": "p"},
                                {"id": "bad", "schedule": "every fortnight", "prompt": "p"}]))
    with pytest.raises(CliError) as info:
        await cli("import", str(path))
    assert info.value.exit_code == 2 and "job 2 (id 'bad')" in str(info.value)
    assert not (await cli.replica.stub.ListJobs(scheduler_pb2.ListJobsRequest())).jobs
    path.write_text("{not json")
    with pytest.raises(CliError) as info:
        await cli("import", str(path))
    assert info.value.exit_code == 2 and "not valid JSON" in str(info.value)
    with pytest.raises(CliError) as info:
        await cli("import", str(tmp_path / "missing.json"))
    assert info.value.exit_code == 2 and "cannot read" in str(info.value)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_exit_codes_of_the_real_command(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTMESH_")}
    env.update(AGENTMESH_HOME=str(tmp_path), AGENTMESH_SCHEDULER_ADDR=f"127.0.0.1:{_free_port()}")

    def agentmesh(*argv: str):
        return subprocess.run([sys.executable, "-m", "agentmesh.cli.main", "cron", *argv], env=env,
                              capture_output=True, text=True, timeout=60)

    unreachable = agentmesh("list")
    assert unreachable.returncode == 1
    assert "cannot reach the scheduler service" in unreachable.stderr and "Traceback" not in unreachable.stderr
    bad = agentmesh("add", "--name", "n", "--schedule", "* * *", "--prompt", "p")
    assert bad.returncode == 2 and "exactly 5" in bad.stderr
    missing = agentmesh("add", "--name", "n")
    assert missing.returncode == 2 and "required" in missing.stderr
