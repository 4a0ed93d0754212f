"""The images `make images` builds: their sizes, and how long a container takes to be useful.

    make images && .venv/bin/python -m benches.images [--runs N]

Service start: from `podman run` of the services image (read-only root, no capabilities, host
network, as the image tests run it) to the first SERVING answer of grpc.health.v1, for each
service; the baseline, measured in the same run, is the same `agentmesh serve SERVICE` started
as a plain process from the project's venv, to the same answer.

Sandbox start-to-exit: one tool call's pod (the executor's own Job template, `true` as the
command) under `podman kube play`, from play to the container's exit code; beside it a plain
`podman run --rm` of the sandbox image running `true`, and the same `true` as a plain process.

Session pods (`--sessions`, on by default): the tools service's own cluster executors in this
process against the podman-backed Kubernetes API of the image tests (tests/images/session_pods.py),
`true` through each, from `run()` to its result: a call's Job pod (the per-call baseline), a
session pod's first call (cold: pod start, then the supervisor's exec stream opened) and its
later calls (a request on that stream: the supervisor starts `true` in the pod), a later `python`
cell in the pod's interpreter, and a session's first call served by a warm pool pod (once the
pool has filled: its pods run and their supervisor streams are open).

Needs root, podman and the images; without them it says so and exits 0 (so `make bench` goes on).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agentmesh.tools.sandbox.base import CommandSpec
from agentmesh.tools.sandbox.k8s_job import build_job, job_name
from agentmesh.tools.settings import KubernetesSandbox
from benches.sandbox import machine
from tests.images.podman import (
    REPO_ROOT,
    SERVICES,
    Podman,
    chart_image,
    free_port,
    missing_tools,
    owned_directory,
    podman_env,
    wait_serving,
)
from tests.images.podman_kube import PodmanKube, kubelet_pod
from tests.images.session_pods import Cluster

BASE_IMAGE = "localhost/agentmesh-base:bookworm"


def image_size_mb(podman: Podman, image: str) -> float:
    return json.loads(podman.text("image", "inspect", image))[0]["Size"] / 1e6


def service_env(name: str, port: int) -> dict[str, str]:
    return {
        f"AGENTMESH_{name.upper()}_ADDR": f"127.0.0.1:{port}",
        "AGENTMESH_LLM_PROVIDER": "scripted",
        "AGENTMESH_TRACES": "none",
        "AGENTMESH_DRAIN_S": "0",
    }


def container_start_s(podman: Podman, image: str, name: str, scratch: Path, run: int) -> float:
    port = free_port()
    home = owned_directory(scratch / f"{name}-{run}")
    options = ["--network", "host", "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
               "--volume", f"{home}:/var/lib/agentmesh"]
    for key, value in service_env(name, port).items():
        options += ["--env", f"{key}={value}"]
    started = time.perf_counter()
    container = podman.start_container(f"{name}-{run}", image, name, options=tuple(options))
    wait_serving(f"127.0.0.1:{port}")
    elapsed = time.perf_counter() - started
    podman.run("rm", "--force", "--volumes", "--time", "0", container, check=False)
    return elapsed


def process_start_s(name: str, scratch: Path, run: int) -> float:
    port = free_port()
    env = {**service_env(name, port), "AGENTMESH_HOME": str(scratch / f"proc-{name}-{run}"), "PATH": os.environ["PATH"]}
    started = time.perf_counter()
    process = subprocess.Popen([str(REPO_ROOT / ".venv" / "bin" / "agentmesh"), "serve", name], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_serving(f"127.0.0.1:{port}")
        return time.perf_counter() - started
    finally:
        process.kill()
        process.wait()


def sandbox_pod_s(podman: Podman, image: str, scratch: Path, run: int) -> float:
    cfg = KubernetesSandbox(image=image, workspace_pvc="workspaces", memory_limit="256Mi")
    spec = CommandSpec(session_id=f"bench-{run}", call_id="c1", argv=("true",), timeout_s=30)
    name = f"{podman.prefix}-{job_name()}"[:63]
    job = build_job(spec, cfg, name, identity=(10001, 10001))
    pod = {"metadata": {"name": name, "labels": job["spec"]["template"]["metadata"]["labels"]}, "spec": job["spec"]["template"]["spec"]}
    claims = {"workspaces": owned_directory(scratch / "workspaces")}
    owned_directory(claims["workspaces"] / spec.session_id)
    manifest = scratch / f"{name}.json"
    manifest.write_text(json.dumps(kubelet_pod(pod, claims)))
    podman.pods.append(name)
    started = time.perf_counter()
    podman.run("kube", "play", "--network", "none", "--quiet", str(manifest))
    code = podman.text("wait", f"{name}-sandbox").strip()
    elapsed = time.perf_counter() - started
    assert code == "0", code
    podman.run("pod", "rm", "--force", "--time", "0", name, check=False)
    return elapsed


def plain_container_s(podman: Podman, image: str) -> float:
    started = time.perf_counter()
    podman.run("run", "--rm", "--network", "none", image, "true")
    return time.perf_counter() - started


def plain_process_s() -> float:
    started = time.perf_counter()
    subprocess.run(["true"], check=True)
    return time.perf_counter() - started


def p50_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


async def session_pods(podman: Podman, image: str, scratch: Path, runs: int, later_calls: int) -> dict[str, list[float]]:
    """Seconds per call: Job pod, session pod first (cold) and later calls, first call from the warm pool."""
    from agentmesh.tools.sandbox.base import CommandSpec

    workspaces = owned_directory(scratch / "session-workspaces")
    kube = PodmanKube(podman, volumes={"agentmesh-workspaces": workspaces}).__enter__()
    cluster = Cluster(kube, image, scratch)
    found: dict[str, list[float]] = {"job": [], "cold": [], "later": [], "cell": [], "warm": [], "exec": []}

    async def timed(executor, session: str, call: int, key: str) -> None:
        spec = CommandSpec(session_id=session, call_id=f"c{call}", argv=("true",), timeout_s=60)
        started = time.perf_counter()
        result = await executor.run(spec)
        found[key].append(time.perf_counter() - started)
        assert result.exit_code == 0 and not result.error_kind, result

    try:
        jobs = cluster.jobs()
        for run in range(runs):
            await timed(jobs, f"job-{run}", 0, "job")
        await jobs.close()
        sessions = cluster.sessions()
        for run in range(runs):
            await timed(sessions, f"cold-{run}", 0, "cold")
            for call in range(1, later_calls + 1):
                await timed(sessions, f"cold-{run}", call, "later")
            for call in range(later_calls + 1, 2 * later_calls + 1):
                spec = CommandSpec(session_id=f"cold-{run}", call_id=f"c{call}", argv=(), timeout_s=60)
                started = time.perf_counter()
                cell = await sessions.run_cell(spec, "x = 1")
                found["cell"].append(time.perf_counter() - started)
                assert cell.result.exit_code == 0 and not cell.result.error_kind, cell
        # The runtime's own floor for a call in a running container: `podman exec` of `true` into
        # the last session's pod, as the tests' kubelet execs (a podman process per exec).
        container = f"{sessions.pod_of(f'cold-{runs - 1}')}-sandbox"
        for _ in range(later_calls):
            started = time.perf_counter()
            await asyncio.to_thread(podman.run, "exec", container, "true")
            found["exec"].append(time.perf_counter() - started)
        await sessions.close()
        pooled = cluster.sessions(pool=(runs, runs))
        pooled.start()
        # A pool that has filled: its pods run and their supervisor streams are open (k8s_pool.py).
        while sum(1 for p in kube.pods.values() if p["status"].get("phase") == "Running"
                  and p["metadata"]["labels"].get("agentmesh.io/pool") == "warm"
                  and pooled.pool is not None and pooled.pool.prepared(p["metadata"]["name"])) < runs:
            await asyncio.sleep(0.1)
        for run in range(runs):
            await timed(pooled, f"warm-{run}", 0, "warm")
        assert pooled.pool is not None and pooled.pool.claims == runs
        await pooled.close()
    finally:
        kube.__exit__(None, None, None)
    return found


def median_ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.0f} ms"


def print_sessions(podman: Podman, sandbox: str, scratch: Path, args: argparse.Namespace) -> None:
    found = asyncio.run(session_pods(podman, sandbox, scratch, args.runs, args.later_calls))
    print("\nsandbox calls in a cluster (executor `run()` of `true` to its result), p50:\n")
    print("| call | p50 | calls |\n| --- | --- | --- |")
    print(f"| per-call Job pod (isolation `call`, the baseline) | {p50_ms(found['job']):.0f} ms | {len(found['job'])} |")
    print(f"| session pod, first call (cold pod start) | {p50_ms(found['cold']):.0f} ms | {len(found['cold'])} |")
    print(f"| session pod, later calls (a request on the supervisor's exec stream) | {p50_ms(found['later']):.0f} ms | {len(found['later'])} |")
    print(f"| session pod, later `python` cells (the pod's interpreter) | {p50_ms(found['cell']):.0f} ms | {len(found['cell'])} |")
    print(f"| session pod, first call from the warm pool | {p50_ms(found['warm']):.0f} ms | {len(found['warm'])} |")
    print(f"| `podman exec true` into the running pod (the test kubelet's floor) | {p50_ms(found['exec']):.0f} ms | {len(found['exec'])} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="starts per measure (the median is reported)")
    parser.add_argument("--later-calls", type=int, default=10, help="calls after the first per session pod")
    parser.add_argument("--only-sessions", action="store_true", help="measure the session pods only")
    args = parser.parse_args()
    if missing := missing_tools():
        print(f"skipped: {', '.join(missing)} not installed (bash .ci/run installs them; then make images)")
        return 0
    if os.geteuid() != 0:
        print("skipped: needs root (rootful podman)")
        return 0
    services, sandbox = chart_image("services"), chart_image("sandbox")
    podman = Podman("ambench")
    for image in (services, sandbox):
        if podman.run("image", "exists", image, check=False).returncode != 0:
            print(f"skipped: {image} is not built (make images)")
            return 0
    print(f"machine: {machine()}; {podman.text('--version').strip()}, runc, cgroupfs")
    scratch = Path(tempfile.mkdtemp(prefix="ambench-images-", dir="/tmp"))
    scratch.chmod(0o711)
    try:
        if args.only_sessions:
            print_sessions(podman, sandbox, scratch, args)
            return 0
        print("\n| image | size |\n| --- | --- |")
        for image in (services, sandbox, BASE_IMAGE):
            if podman.run("image", "exists", image, check=False).returncode == 0:
                print(f"| {image} | {image_size_mb(podman, image):.0f} MB |")

        print(f"\nstart to SERVING (grpc.health.v1), median of {args.runs}:\n")
        print("| service | container (services image) | process (venv) | difference |\n| --- | --- | --- | --- |")
        for name in SERVICES:
            container = [container_start_s(podman, services, name, scratch, run) for run in range(args.runs)]
            process = [process_start_s(name, scratch, run) for run in range(args.runs)]
            difference = (statistics.median(container) - statistics.median(process)) * 1000
            print(f"| {name} | {median_ms(container)} | {median_ms(process)} | {difference:+.0f} ms |", flush=True)

        print(f"\nsandbox: `true` from start to exit code, median of {args.runs}:\n")
        pods = [sandbox_pod_s(podman, sandbox, scratch, run) for run in range(args.runs)]
        containers = [plain_container_s(podman, sandbox) for _ in range(args.runs)]
        processes = [plain_process_s() for _ in range(args.runs)]
        print("| how | median |\n| --- | --- |")
        print(f"| `podman kube play` of the executor's pod | {median_ms(pods)} |")
        print(f"| `podman run --rm` of the sandbox image | {median_ms(containers)} |")
        print(f"| plain process | {statistics.median(processes) * 1000:.1f} ms |")
        print_sessions(podman, sandbox, scratch, args)
    finally:
        podman.cleanup()
        subprocess.run(["rm", "-rf", str(scratch)], env=podman_env())
    return 0


if __name__ == "__main__":
    sys.exit(main())
