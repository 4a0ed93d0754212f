"""The workspace quota in sandbox pods (fake API server; the container's command runs as a local
process in the claim's directory, so the wrapper's shell and the service's own watch both run for real)."""

from __future__ import annotations

import os

import kubernetes_validate
import pytest

from agentmesh.tools.quota import workspace_usage
from tests.tools.backends import BACKENDS
from tests.tools.fake_kube import K8S_VERSION
from tests.tools.support import ToolsClient, wait_until

MIB = 1024 * 1024
QUOTA_ENV = {"AGENTMESH_TOOLS_WORKSPACE_QUOTA_MB": "64", "AGENTMESH_SANDBOX_FILE_SIZE_BYTES": str(64 * MIB)}


@pytest.fixture
def fake(home):
    backend = BACKENDS["fake-kubernetes"](home)
    yield backend
    backend.close()


async def test_every_pod_runs_its_command_under_the_workspace_quota(fake, home):
    async with ToolsClient(home, {**fake.env(), **QUOTA_ENV}) as tools:
        result = await tools.call("shell", {"command": "echo inside"})
    assert not result.is_error and result.stdout == "inside\n", result.output
    container = fake.fake.posted[0]["spec"]["template"]["spec"]["containers"][0]
    command = container["command"]
    assert command[:2] == ["/bin/sh", "-c"] and "ulimit -f" in command[2]
    # quota and per-file limit in KiB, then the call's own command untouched.
    assert command[3:] == ["agentmesh-quota", str(64 * 1024), str(64 * 1024), "--", "/bin/sh", "-c", "echo inside"]
    assert fake.fake.invalid == []


def test_without_a_claim_the_workspace_is_an_empty_dir_sized_to_the_quota():
    from agentmesh.tools.sandbox.base import CommandSpec
    from agentmesh.tools.sandbox.k8s_job import build_job
    from agentmesh.tools.settings import KubernetesSandbox

    job = build_job(CommandSpec("s1", "c1", ("true",), 30), KubernetesSandbox(), "agentmesh-sbx-1", quota_bytes=512 * MIB)
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    volumes = job["spec"]["template"]["spec"]["volumes"]
    assert {"name": "workspace", "emptyDir": {"sizeLimit": "512Mi"}} in volumes


async def test_many_files_stop_at_the_quota_in_a_pod(fake, home):
    async with ToolsClient(home, {**fake.env(), **QUOTA_ENV}) as tools:
        command = "for i in 1 2 3 4 5 6 7 8; do head -c 60M /dev/zero > f$i || exit 1; done; echo all-written"
        result = await tools.call("shell", {"command": command, "timeout_s": 60})
        assert result.is_error and result.error_kind == "disk_quota", result.output
        assert "65536 KiB quota" in result.output or "64.0 MiB disk quota" in result.output
        assert "all-written" not in result.stdout
        assert result.data["quota_bytes"] == 64 * MIB
        assert len(os.listdir(tools.workspace("s1"))) < 8
        # A call that starts over the quota may still delete; then writes work again.
        freed = await tools.call("shell", {"command": "rm -f f*; echo freed"})
        assert not freed.is_error and "freed" in freed.stdout, freed.output
        again = await tools.call("shell", {"command": "head -c 10M /dev/zero > g && echo ok"})
        assert not again.is_error and "ok" in again.stdout, again.output
        # Another session's pod is not affected.
        other = await tools.call("shell", {"command": "head -c 30M /dev/zero > big && echo ok"}, session_id="s2")
        assert not other.is_error and "ok" in other.stdout, other.output
    assert await wait_until(lambda: not fake.leftovers("")), fake.leftovers("")


async def test_the_service_stops_a_pod_whose_own_watch_was_killed(fake, home):
    """The wrapper's loop runs as the program's uid, so a program can kill it; the tools service
    measures the shared claim itself and deletes the Job."""
    blind = "for p in $(pgrep -P $PPID); do [ $p = $$ ] || kill -9 $p; done"
    slow_writer = "for i in $(seq 1 60); do head -c 4M /dev/zero > f$i; sleep 0.1; done; echo all-written"
    async with ToolsClient(home, {**fake.env(), **QUOTA_ENV}) as tools:
        result = await tools.call("shell", {"command": f"{blind}; {slow_writer}", "timeout_s": 60})
        files = len(os.listdir(tools.workspace("s1")))
    assert result.is_error and result.error_kind == "disk_quota", result.output
    assert "was stopped" in result.output and "all-written" not in result.stdout
    assert files < 60
    assert workspace_usage(home / "workspaces" / "s1") < 2 * 64 * MIB
    assert await wait_until(lambda: not fake.leftovers("")), fake.leftovers("")


def test_an_evicted_workspace_is_a_disk_quota():
    from agentmesh.tools.sandbox.k8s_watch import JobTracker

    tracker = JobTracker("job", timeout_s=10, start_timeout_s=5, memory_limit="128Mi", created_at=0.0)
    evicted = {
        "metadata": {"name": "job-abcde"},
        "status": {
            "phase": "Failed",
            "reason": "Evicted",
            "message": 'Usage of EmptyDir volume "workspace" exceeds the limit "1Gi". ',
            "containerStatuses": [{"name": "sandbox", "state": {"terminated": {"exitCode": 137, "reason": "Error"}}}],
        },
    }
    verdict = tracker.on_pod(evicted, 1.0)
    assert verdict.error_kind == "disk_quota" and "exceeds the limit" in verdict.detail
    evicted["status"]["message"] = "The node was low on resource: memory."
    assert tracker.on_pod(evicted, 1.0).error_kind == "sandbox_error"
