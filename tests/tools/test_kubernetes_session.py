"""Session sandboxes in a cluster (AGENTMESH_SANDBOX=kubernetes, AGENTMESH_SANDBOX_ISOLATION=session):
one pod per session, each call a process through pods/exec, and the warm pool.

Against the tests' Kubernetes API server (fake_kube.py; pods/exec over a real websocket, its
containers local processes). The image tests run the same pods under podman
(tests/images/test_session_pod.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import urllib.request

import pytest

from agentmesh.internal.v1 import tools_service_pb2
from agentmesh.tools.sandbox.k8s_pool import PoolSizing
from agentmesh.tools.sandbox.k8s_quota import WRAPPER
from agentmesh.tools.sandbox.k8s_session_pod import CALL_WRAPPER, build_session_pod
from agentmesh.tools.sandbox.k8s_session_reap import ANNOTATION_LAST_USED
from agentmesh.tools.sandbox.supervisor_link import BOOT, SUPERVISOR_SOURCE
from agentmesh.tools.settings import KubernetesSandbox
from tests.support.timing import PATIENCE_S
from tests.tools.backends import BACKENDS, CLAIM, NAMESPACE
from tests.tools.support import ToolsClient, processes_with, wait_until


@pytest.fixture
def fake(home):
    backend = BACKENDS["fake-kubernetes"](home)
    yield backend
    backend.close()


def session_env(fake, **extra: str) -> dict[str, str]:
    return {**fake.env(), "AGENTMESH_SANDBOX_ISOLATION": "session", **extra}


def pods(fake, prefix: str = "agentmesh-") -> list[str]:
    return [name for name in fake.fake.live_objects()[1] if name.startswith(prefix)]


def exec_pods(fake) -> list[str]:
    return [pod for pod, _, _ in fake.fake.execs_served]


def session_pod(fake, session_id: str) -> str:
    with fake.fake.cond:
        return next(p["metadata"]["name"] for p in fake.fake.pods.values()
                    if p["metadata"]["labels"].get("agentmesh.io/session") == session_id)


def warm_ready(fake) -> set[str]:
    """Running warm pods whose supervisor stream is open already (k8s_pool.py: prepare)."""
    with fake.fake.cond:
        warm = {p["metadata"]["name"] for p in fake.fake.pods.values()
                if p["metadata"]["labels"].get("agentmesh.io/pool") == "warm" and p["status"].get("phase") == "Running"}
    return warm & set(exec_pods(fake))


def warm_running(fake) -> int:
    with fake.fake.cond:
        return sum(1 for pod in fake.fake.pods.values()
                   if pod["metadata"]["labels"].get("agentmesh.io/pool") == "warm" and pod["status"].get("phase") == "Running")


async def test_a_sessions_calls_run_in_one_hardened_pod_on_its_workspace(fake, home):
    async with ToolsClient(home, session_env(fake)) as tools:
        first = await tools.call("shell", {"command": "echo kept > notes.txt; echo to-err >&2; pwd"}, session_id="team.a")
        second = await tools.call("shell", {"command": "cat notes.txt; exit 3"}, session_id="team.a", call_id="c2")
        other = await tools.call("shell", {"command": "ls -a"}, session_id="team.b")
    assert not first.is_error, first.output
    assert first.stdout.strip().endswith("team.a") and "to-err" in first.stderr  # stdout and stderr apart
    assert second.exit_code == 3 and second.stdout == "kept\n"
    assert (tools.workspace("team.a") / "notes.txt").read_text() == "kept\n"
    # One pod per session, no Job; both of team.a's calls were processes in its one pod, started
    # by the session supervisor over the one exec stream it has.
    posted = fake.fake.posted
    assert [obj["kind"] for obj in posted] == ["Pod", "Pod"] and fake.fake.invalid == []
    assert exec_pods(fake) == [posted[0]["metadata"]["name"], posted[1]["metadata"]["name"]]
    assert all(command[:3] == ["python3", "-I", "-c"] for _, _, command in fake.fake.execs_served)
    assert all(protocol == "v5.channel.k8s.io" for _, protocol, _ in fake.fake.execs_served)
    pod = posted[0]
    assert pod["metadata"]["labels"]["agentmesh.io/session"] == "team.a"
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False and spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    hardening = spec["containers"][0]["securityContext"]
    assert hardening["readOnlyRootFilesystem"] is True and hardening["capabilities"] == {"drop": ["ALL"]}
    assert hardening["allowPrivilegeEscalation"] is False
    assert set(spec["containers"][0]["resources"]["limits"]) >= {"cpu", "memory"}
    assert {"name": "workspace", "mountPath": "/workspace", "subPath": "team.a"} in spec["containers"][0]["volumeMounts"]
    assert {"name": "workspace", "persistentVolumeClaim": {"claimName": CLAIM}} in spec["volumes"]
    # Session b's pod mounts its own, empty, workspace (what else it can see: tests/images, real containers).
    assert other.stdout.split() == [".", ".."], other.output
    # Deleting a session's workspace deletes its pod; closing the service deletes the rest.
    assert await wait_until(lambda: not pods(fake)), pods(fake)
    assert ("create", "pods/exec") in fake.fake.requests and fake.fake.forbidden == []


async def test_a_timeout_kills_the_calls_processes_and_keeps_the_pod(fake, home):
    marker = "sleep 31.4159"
    async with ToolsClient(home, session_env(fake)) as tools:
        slow = await tools.call("shell", {"command": f"{marker}; echo never", "timeout_s": 1})
        assert slow.is_error and slow.error_kind == "timeout", slow.output
        assert await wait_until(lambda: not processes_with(marker)), processes_with(marker)
        after = await tools.call("shell", {"command": "echo again"}, call_id="c2")
    assert after.stdout == "again\n"
    assert len(set(exec_pods(fake))) == 1 and len(fake.fake.posted) == 1


async def test_output_past_the_drain_bound_stops_the_call(fake, home):
    env = session_env(fake, AGENTMESH_TOOLS_OUTPUT_DRAIN_BYTES="65536", AGENTMESH_TOOLS_OUTPUT_CAP_BYTES="1024")
    async with ToolsClient(home, env) as tools:
        result = await tools.call("shell", {"command": "yes flood-of-output"})
        assert result.is_error and result.error_kind == "output_limit", result.output
        assert await wait_until(lambda: not processes_with("yes flood-of-output"))
        small = await tools.call("shell", {"command": "seq 1 3000"}, call_id="c2")
    assert small.truncated and "truncated" in small.stdout and small.stdout.rstrip().endswith("3000")


@pytest.mark.parametrize("start_s", [0, 1.5], ids=["quick-start", "slow-start"])
async def test_an_idle_pod_is_reaped_and_the_next_call_gets_a_new_one_with_the_workspace(fake, home, start_s):
    # A slow start outlasts twice the idle time: the sweep of abandoned pods must not take a pod
    # this replica is still starting (it did: a third pod, or a failed call).
    fake.fake.start_delay_s = start_s
    async with ToolsClient(home, session_env(fake, AGENTMESH_SANDBOX_SESSION_IDLE_S="0.5")) as tools:
        assert not (await tools.call("shell", {"command": "echo stays > kept.txt"})).is_error
        assert await wait_until(lambda: not pods(fake)), pods(fake)
        again = await tools.call("shell", {"command": "cat kept.txt"}, call_id="c2")
    assert again.stdout == "stays\n"
    assert len(set(exec_pods(fake))) == 2 and len(fake.fake.posted) == 2


async def test_deleting_the_workspace_deletes_the_sessions_pod(fake, home):
    async with ToolsClient(home, session_env(fake)) as tools:
        await tools.call("shell", {"command": "true"}, session_id="gone")
        assert len(pods(fake)) == 1
        await tools.as_gateway.DeleteWorkspace(tools_service_pb2.DeleteWorkspaceRequest(session_id="gone"))
        assert pods(fake) == []


async def test_a_pod_killed_mid_call_gives_an_error_result_and_the_next_call_a_new_pod(fake, home):
    async with ToolsClient(home, session_env(fake)) as tools:
        call = asyncio.create_task(tools.call("shell", {"command": "echo started; sleep 60", "timeout_s": 120}))
        assert await wait_until(lambda: fake.fake.execs_served and processes_with("sleep 60"), timeout_s=20)
        (name,) = pods(fake)
        # As a person (`kubectl delete pod`) or the node would: through the API.
        request = urllib.request.Request(f"{fake.fake.url}/api/v1/namespaces/{NAMESPACE}/pods/{name}", method="DELETE")
        await asyncio.to_thread(urllib.request.urlopen, request)
        result = await call
        assert result.is_error and result.error_kind == "sandbox_error", result.output
        assert "went away" in result.output
        after = await tools.call("shell", {"command": "echo fresh"}, call_id="c2")
    assert after.stdout == "fresh\n"
    assert len(set(exec_pods(fake))) == 2


async def test_a_warm_pod_serves_a_sessions_first_call_and_the_pool_refills(fake, home):
    env = session_env(fake, AGENTMESH_SANDBOX_WARM_POOL_MIN="2", AGENTMESH_SANDBOX_WARM_POOL_MAX="3")
    async with ToolsClient(home, env) as tools:
        assert await wait_until(lambda: len(warm_ready(fake)) >= 2, timeout_s=20)
        result = await tools.call("shell", {"command": "echo from-warm > w.txt; ls -a"}, session_id="fresh")
        assert result.stdout.split() == [".", "..", "w.txt"], result.output
        served = session_pod(fake, "fresh")
        assert served.startswith("agentmesh-warm-")
        # Its supervisor's stream was opened before the claim: the call opened none.
        assert exec_pods(fake).count(served) == 1
        # The warm pod's directory became the session's workspace; the pool is whole again.
        assert (tools.workspace("fresh") / "w.txt").read_text() == "from-warm\n"
        assert not (home / "workspaces" / "@warm-pool" / served).exists()
        with fake.fake.cond:
            claimed = next(p for p in fake.fake.pods.values() if p["metadata"]["name"] == served)["metadata"]
        assert claimed["labels"]["agentmesh.io/pool"] == "claimed" and claimed["labels"]["agentmesh.io/session"] == "fresh"
        assert await wait_until(lambda: warm_running(fake) >= 2, timeout_s=20)
        # A session that has files already gets a cold pod on them (files never move).
        (tools.workspace("has-files")).mkdir()
        (tools.workspace("has-files") / "old.txt").write_text("old\n")
        old = await tools.call("shell", {"command": "cat old.txt"}, session_id="has-files")
        assert old.stdout == "old\n" and session_pod(fake, "has-files").startswith("agentmesh-ses-")
    assert fake.fake.invalid == [] and fake.fake.patches
    assert all(p["metadata"]["resourceVersion"] for p in fake.fake.patches)


def test_a_pool_still_making_its_first_pods_is_not_idle():
    """Idle time counts from the first time the pool held its size: a pool whose first pods took
    longer than its idle time to make (a slow API server) kept none and retired before any claim."""
    sizing = PoolSizing(floor=2, ceiling=4, window_s=300, idle_s=0.05)
    time.sleep(0.1)  # longer than idle_s, still filling
    assert sizing.target() == 2
    sizing.filled()
    assert sizing.target() == 2
    time.sleep(0.1)  # idle_s without a claim since it filled
    assert sizing.target() == 0
    sizing.claimed()
    assert sizing.target() == 2


async def test_an_idle_pool_scales_to_zero(fake, home):
    env = session_env(fake, AGENTMESH_SANDBOX_WARM_POOL_MIN="2", AGENTMESH_SANDBOX_WARM_POOL_MAX="2",
                      AGENTMESH_SANDBOX_WARM_POOL_IDLE_S="1")
    async with ToolsClient(home, env) as tools:
        def made() -> int:
            return sum(1 for obj in fake.fake.posted if obj["metadata"]["name"].startswith("agentmesh-warm-"))

        # Both made and stored (a pod is counted as posted before the API server has stored it):
        # the pool retires nothing before it held its size (k8s_pool.PoolSizing.filled).
        assert await wait_until(lambda: made() >= 2 and len(pods(fake, "agentmesh-warm-")) >= 2, timeout_s=20)
        # A second after it first held its size, with no claim, the pool retires its pods and makes none.
        assert await wait_until(lambda: not pods(fake, "agentmesh-warm-"), timeout_s=20), pods(fake)
        before = made()
        await asyncio.sleep(1.5)  # two refill rounds: nothing new (a wait for an absence, not a bound)
        assert made() == before and not pods(fake, "agentmesh-warm-")
        assert not list((home / "workspaces" / "@warm-pool").iterdir())
        # Cold again, and working.
        result = await tools.call("shell", {"command": "echo cold"})
    assert result.stdout == "cold\n"


# Two replicas and twenty pods: a multi-replica test, in the slow tier with the others.
@pytest.mark.slow
async def test_twenty_first_calls_from_two_replicas_get_twenty_distinct_pods(fake, home):
    env = session_env(fake, AGENTMESH_SANDBOX_WARM_POOL_MIN="20", AGENTMESH_SANDBOX_WARM_POOL_MAX="20")
    async with ToolsClient(home, env) as one, ToolsClient(home, env) as two:
        assert await wait_until(lambda: warm_running(fake) >= 20, timeout_s=60), warm_running(fake)
        calls = [(one if n % 2 else two).call("shell", {"command": f"echo s{n} > mine.txt; ls"}, session_id=f"s{n}")
                 for n in range(20)]
        results = await asyncio.gather(*calls)
        assert all(r.stdout == "mine.txt\n" for r in results), [r.output for r in results]
        served = [session_pod(fake, f"s{n}") for n in range(20)]
        assert len(set(served)) == 20
        assert all(name.startswith("agentmesh-warm-") for name in served)
        for n in range(20):
            assert (one.workspace(f"s{n}") / "mine.txt").read_text() == f"s{n}\n"
        with fake.fake.cond:
            sessions = {p["metadata"]["name"]: p["metadata"]["labels"].get("agentmesh.io/session") for p in fake.fake.pods.values()}
        assert sorted(sessions[name] for name in served) == sorted(f"s{n}" for n in range(20))
    assert fake.fake.invalid == []


async def test_a_session_pod_no_replica_uses_is_deleted(fake, home):
    # A pod left by a replica that went away: its last use long past the idle time.
    orphan = build_session_pod(KubernetesSandbox(namespace=NAMESPACE, workspace_pvc=CLAIM), "agentmesh-ses-orphan", (os.getuid() or 65534,) * 2,
                               template="default", session_id="left-behind")
    orphan["metadata"]["annotations"][ANNOTATION_LAST_USED] = f"{time.time() - 3600:.3f}"
    request = urllib.request.Request(f"{fake.fake.url}/api/v1/namespaces/{NAMESPACE}/pods", data=json.dumps(orphan).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
    await asyncio.to_thread(urllib.request.urlopen, request)
    async with ToolsClient(home, session_env(fake, AGENTMESH_SANDBOX_SESSION_IDLE_S="1")) as tools:
        assert not (await tools.call("shell", {"command": "true"}, session_id="alive")).is_error
        assert await wait_until(lambda: "agentmesh-ses-orphan" not in pods(fake), timeout_s=30), pods(fake)

        def marked() -> bool:  # the replica writes its own pod's use into it
            return any(ANNOTATION_LAST_USED in (p["metadata"].get("annotations") or {}) for p in fake.fake.patches)

        assert await wait_until(marked, timeout_s=30), fake.fake.patches
        assert pods(fake) == [tools_pod := pods(fake)[0]] and tools_pod != "agentmesh-ses-orphan"


async def test_python_in_a_session_pod_keeps_its_interpreter(fake, home):
    async with ToolsClient(home, session_env(fake)) as tools:
        first = await tools.call("python", {"code": "x = 41"})
        assert not first.is_error, first.output
        between = await tools.call("shell", {"command": "echo in between"}, call_id="c2")
        assert between.stdout == "in between\n", between.output
        later = await tools.call("python", {"code": "print(x + 1)"}, call_id="c3")
        assert later.stdout == "42\n", later.output
        stuck = await tools.call("python", {"code": "while True: pass", "timeout_s": 1}, call_id="c4")
        assert stuck.error_kind == "timeout" and "KeyboardInterrupt" in stuck.stderr, stuck.output
        kept = await tools.call("python", {"code": "x"}, call_id="c5")
        assert kept.output == "41", kept.output
        restarted = await tools.call("python", {"restart": True}, call_id="c6")
        assert not restarted.is_error, restarted.output
        gone = await tools.call("python", {"code": "print(x)"}, call_id="c7")
        assert gone.is_error and "NameError" in gone.stderr, gone.output
    # All of it in one pod, through one exec stream.
    assert len(fake.fake.posted) == 1 and len(exec_pods(fake)) == 1


def test_the_supervisor_kills_its_calls_when_its_stream_ends(tmp_path):
    """The lifeline in a pod: the exec stream's end closes the supervisor's stdin, and it kills
    its calls' process groups (they run in sessions of their own) before it exits."""
    marker = "sleep 391.7"
    supervisor = subprocess.Popen(["python3", "-I", "-c", BOOT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  cwd=tmp_path)
    try:
        request = {"op": "exec", "id": 1, "argv": ["/bin/sh", "-c", f"{marker}; echo never"], "env": {},
                   "inherit_env": True, "limits": {}, "cap": 4096, "drain": 65536}
        supervisor.stdin.write((json.dumps(SUPERVISOR_SOURCE) + "\n" + json.dumps(request) + "\n").encode())
        supervisor.stdin.flush()
        deadline = time.monotonic() + PATIENCE_S
        while not processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_with(marker)
        supervisor.stdin.close()
        assert supervisor.wait(PATIENCE_S) == 0
        deadline = time.monotonic() + PATIENCE_S
        while processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not processes_with(marker)
    finally:
        supervisor.kill()
        supervisor.wait()


async def test_a_background_command_in_a_session_pod_can_be_read_while_it_runs_and_stopped(fake, home):
    marker = "sleep 47.31"
    async with ToolsClient(home, session_env(fake)) as tools:
        # It writes `early-2`: text its command line (which the listing shows) does not hold.
        started = await tools.call("background_run", {"command": f"echo early-$((1 + 1)); {marker}"})
        command_id = started.output.split()[1]
        seen = {}

        async def written() -> bool:
            seen["check"] = await tools.call("background_check", {"id": command_id}, call_id="check")
            return "early-2" in seen["check"].output

        for _ in range(400):  # until the command has written its line (a liveness bound)
            if await written():
                break
            await asyncio.sleep(0.05)
        assert "running" in seen["check"].output and "[output so far]" in seen["check"].output, seen["check"].output
        stopped = await tools.call("background_stop", {"id": command_id}, call_id="stop")
        assert stopped.output == f"Stopped {command_id}.", stopped.output
        assert await wait_until(lambda: not processes_with(marker)), processes_with(marker)
    assert len(fake.fake.posted) == 1 and len(exec_pods(fake)) == 1


async def test_a_cell_writing_past_the_workspace_quota_is_interrupted_and_keeps_its_variables(fake, home):
    async with ToolsClient(home, session_env(fake, AGENTMESH_TOOLS_WORKSPACE_QUOTA_MB="1")) as tools:
        assert not (await tools.call("python", {"code": "kept = 'yes'"})).is_error
        # Small files, each well under the per-file limit: only the watch of the claim stops it.
        code = "import itertools\nfor n in itertools.count():\n    open(f'f{n}.bin', 'wb').write(b'x' * 65536)"
        full = await tools.call("python", {"code": code, "timeout_s": 30}, call_id="c2")
        assert full.error_kind == "disk_quota" and "KeyboardInterrupt" in full.stderr, full.output
        after = await tools.call("python", {"code": "kept"}, call_id="c3")
    assert after.output == "'yes'", after.output


def test_a_calls_program_stays_in_the_process_group_the_supervisor_kills():
    # The quota wrapper's own `setsid` would put the program out of the supervisor's reach.
    assert "setsid" in WRAPPER and "setsid" not in CALL_WRAPPER and '"$@" &' in CALL_WRAPPER
