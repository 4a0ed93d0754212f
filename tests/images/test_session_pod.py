"""Session pods (AGENTMESH_SANDBOX_ISOLATION=session in a cluster) run by a real container runtime.

The tools service's session executor (k8s_session.py) runs in the test process against the
podman-backed Kubernetes API (tests/images/session_pods.py): each session's pod is a
`podman kube play` of the executor's own manifest from the sandbox image, each call a
`podman exec` behind pods/exec's websocket.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import pytest

from agentmesh.tools.sandbox.base import CommandSpec
from tests.images.podman import SERVICE_UID, owned_directory
from tests.images.podman_kube import PodmanKube
from tests.images.session_pods import Cluster
from tests.images.test_sandbox_pod import SHOW_IDENTITY, proc_status

pytestmark = [pytest.mark.images, pytest.mark.timeout(1800), pytest.mark.xdist_group("images")]


@pytest.fixture
def cluster(images, podman):
    scratch = Path(tempfile.mkdtemp(prefix="amtest-sessions-", dir="/tmp"))
    scratch.chmod(0o711)
    workspaces = owned_directory(scratch / "workspaces")
    kube = PodmanKube(podman, volumes={"agentmesh-workspaces": workspaces}).__enter__()
    try:
        yield Cluster(kube, images["sandbox"], scratch)
    finally:
        kube.__exit__(None, None, None)
        shutil.rmtree(scratch, ignore_errors=True)


def call(session: str, command: str, call_id: str = "c1", timeout_s: float = 60) -> CommandSpec:
    return CommandSpec(session_id=session, call_id=call_id, argv=("/bin/sh", "-c", command), timeout_s=timeout_s)


async def test_a_sessions_calls_share_its_hardened_pod_and_see_nothing_of_another(cluster):
    sessions = cluster.sessions()
    try:
        first = await sessions.run(call("iso-a", f"{SHOW_IDENTITY}; touch /probe; echo secret > mine.txt; echo kept > /tmp/t; pwd"))
        assert first.exit_code == 0 and not first.error_kind, first
        status = proc_status(first.stdout)
        assert f"uid={SERVICE_UID}" in first.stdout and status["Uid"].split() == [str(SERVICE_UID)] * 4
        for caps in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
            assert int(status[caps], 16) == 0, f"{caps}: {status[caps]}"
        assert status["NoNewPrivs"] == "1" and status["Seccomp"] == "2"
        assert "Read-only file system" in first.stderr and first.stdout.rstrip().endswith("/workspace")
        # The second call is a new process in the same pod: the pod's /tmp is still there.
        second = await sessions.run(call("iso-a", "cat /tmp/t mine.txt", "c2"))
        assert second.stdout == "kept\nsecret\n", second
        other = await sessions.run(call("iso-b", "ls -a /workspace; cat /tmp/t; find / -name mine.txt 2>/dev/null; echo end"))
        assert other.stdout.split() == [".", "..", "end"], other
        pods = {m["metadata"]["name"] for m in cluster.kube.played}
        assert len(pods) == 2 and cluster.kube.invalid == []
        state = cluster.kube.podman.inspect(f"{sessions.pod_of('iso-a')}-sandbox")
        assert state["HostConfig"]["ReadonlyRootfs"] is True and state["HostConfig"]["Memory"] == 128 * 2**20
    finally:
        await sessions.close()


async def test_killing_the_pod_mid_call_is_an_error_and_the_next_call_a_new_pod(cluster):
    sessions = cluster.sessions()
    try:
        assert (await sessions.run(call("kill-1", "echo stays > kept.txt"))).exit_code == 0
        pod = sessions.pod_of("kill-1")
        running = asyncio.create_task(sessions.run(call("kill-1", "sleep 120", "c2", timeout_s=300)))
        await asyncio.sleep(1)  # let the call start; the outcome does not depend on how long
        cluster.kube.podman.run("pod", "rm", "--force", "--time", "0", pod)
        result = await running
        assert result.error_kind == "sandbox_error", result
        after = await sessions.run(call("kill-1", "cat kept.txt", "c3"))
        assert after.stdout == "stays\n" and sessions.pod_of("kill-1") != pod
    finally:
        await sessions.close()


async def test_a_warm_pod_becomes_the_sessions_own(cluster):
    sessions = cluster.sessions(pool=(2, 2))
    sessions.start()
    try:
        deadline = asyncio.get_running_loop().time() + 300
        while sum(1 for p in cluster.kube.pods.values() if p["status"].get("phase") == "Running") < 2:
            assert asyncio.get_running_loop().time() < deadline, "the pool did not fill"
            await asyncio.sleep(0.2)
        assert not (await sessions.run(call("warm-a", "echo a > a.txt"))).error_kind
        result = await sessions.run(call("warm-b", "ls -a /workspace; find / -name a.txt 2>/dev/null; echo end"))
        assert result.stdout.split() == [".", "..", "end"], result
        assert sessions.pod_of("warm-a").startswith("agentmesh-warm-") and sessions.pod_of("warm-b").startswith("agentmesh-warm-")
        assert (cluster.workspaces / "warm-a" / "a.txt").read_text() == "a\n"
    finally:
        await sessions.close()


async def test_python_keeps_its_interpreter_in_the_pod_and_a_timeout_kills_only_its_call(cluster):
    sessions = cluster.sessions()
    try:
        first = await sessions.run_cell(call("kernel-1", ""), "x = 41")
        assert first.result.exit_code == 0 and not first.result.error_kind, first
        later = await sessions.run_cell(call("kernel-1", "", "c2"), "print(x + 1)")
        assert later.result.stdout == "42\n", later
        stuck = await sessions.run_cell(call("kernel-1", "", "c3", timeout_s=1), "while True: pass")
        assert stuck.result.error_kind == "timeout" and "KeyboardInterrupt" in stuck.result.stderr, stuck
        slow = await sessions.run(call("kernel-1", "sleep 120", "c4", timeout_s=1))
        assert slow.error_kind == "timeout" and "pod stays" in slow.detail, slow
        # The sleep's process group is gone; the interpreter and the pod stay.
        left = await sessions.run(call("kernel-1", "ps -eo args | grep -c '^sleep 120' || true", "c5"))
        assert left.stdout.strip() == "0", left
        kept = await sessions.run_cell(call("kernel-1", "", "c6"), "x")
        assert kept.result.stdout == "41\n", kept
        await sessions.restart_kernel("kernel-1")
        gone = await sessions.run_cell(call("kernel-1", "", "c7"), "x")
        assert "NameError" in gone.result.stderr, gone
        assert len(cluster.kube.played) == 1
    finally:
        await sessions.close()
