"""`scheduler.jobs` becomes the jobs file the scheduler watches: a ConfigMap, mounted as a
directory (so the kubelet's updates reach the running pod), that the scheduler's own reader
accepts; an empty list still renders (removing the last job must reach the scheduler)."""

from __future__ import annotations

import helm_python
import pytest

from agentmesh.scheduler.declared import declared_jobs, read_document
from tests.helm.helm_support import RELEASE, container_env, render, render_files

JOBS = [
    {"name": "morning-brief", "schedule": "0 8 * * 1-5", "timezone": "Europe/Berlin",
     "message": "Summarise what happened overnight.", "session": "morning-brief"},
    {"name": "launch", "at": "2027-03-01T09:00Z", "message": "Post the launch note.", "enabled": False},
]


def _jobs_file(rendered) -> str:
    return rendered.get("ConfigMap", f"{RELEASE}-scheduler-jobs")["data"]["jobs.json"]


def test_jobs_become_the_file_the_scheduler_watches():
    rendered = render({"scheduler": {"jobs": JOBS}})
    jobs = declared_jobs(read_document(_jobs_file(rendered), "jobs.json"), "file:/etc/agentmesh/scheduler/jobs.json")
    assert [(j.name, j.schedule, j.timezone, j.session_id, j.enabled) for j in jobs] == [
        ("morning-brief", "0 8 * * 1-5", "Europe/Berlin", "morning-brief", True), ("launch", "", "UTC", "", False)]
    assert jobs[1].run_at > 0

    pod = rendered.deployment("scheduler")["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container_env(container)["AGENTMESH_SCHEDULER_JOBS_FILE"] == "/etc/agentmesh/scheduler/jobs.json"
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "scheduler-jobs"]
    assert mount == {"name": "scheduler-jobs", "mountPath": "/etc/agentmesh/scheduler", "readOnly": True}
    [volume] = [v for v in pod["volumes"] if v["name"] == "scheduler-jobs"]
    assert volume["configMap"]["name"] == f"{RELEASE}-scheduler-jobs"
    # No checksum annotation: a changed list is picked up by the running scheduler, no restart.
    annotations = rendered.deployment("scheduler")["spec"]["template"]["metadata"].get("annotations", {})
    assert not any("scheduler-jobs" in key for key in annotations)


def test_an_empty_list_still_renders_an_empty_file():
    assert read_document(_jobs_file(render()), "jobs.json") == []


@pytest.mark.parametrize("job, fragment", [
    ({"name": "x", "shedule": "every 1m", "message": "m"}, "shedule"),
    ({"name": "x", "message": "m"}, "/scheduler/jobs/0"),
    ({"name": "x", "schedule": "every 1m", "at": "2027-01-01T00:00Z", "message": "m"}, "/scheduler/jobs/0"),
])
def test_the_schema_rejects_a_malformed_job(job, fragment):
    with pytest.raises(helm_python.HelmValuesError) as caught:
        render_files({"scheduler": {"jobs": [job]}})
    assert fragment in str(caught.value)
