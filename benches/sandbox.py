"""Sandbox cost per call: the local bubblewrap jail beside a plain subprocess, and the Kubernetes
executor's own overhead on top of the API server's answers.

    .venv/bin/python -m benches.sandbox [--calls N]

Local: start-to-exit of `true` and of a small Python script, p50/p99 latency and calls per
second at 1 and 8 concurrent calls, through `LocalJail.run` (the executor the tools service
uses, rlimits, output capture and all) and through an unsandboxed `asyncio` subprocess of the
same program, measured in the same run; the ratio is jail / plain.

Kubernetes: `KubernetesExecutor.run` against the fake API server of the tests with containers
that finish at once, so what is left is our work per call (build, create, list, watch, log,
delete) plus the API server's answers; beside it the least a correct client does (create, watch
the pod to its end, read the log, delete), synchronously with the kubernetes client.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Awaitable, Callable

from opentelemetry import trace

from agentmesh.tools.sandbox.base import CommandSpec
from agentmesh.tools.sandbox.local import LocalJail, clean_environment, jail_host_identity
from agentmesh.tools.settings import ToolsSettings
from agentmesh.tools.workspace import Workspaces

PY_SCRIPT = "import json, hashlib\nprint(hashlib.sha256(json.dumps([i * i for i in range(2000)]).encode()).hexdigest())"
# Absolute paths, resolved on the jail's PATH, so both sides start the very same binaries.
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
PROGRAMS = {
    "true": (shutil.which("true", path=SYSTEM_PATH) or "/bin/true",),
    "python": (shutil.which("python3", path=SYSTEM_PATH) or "python3", "-c", PY_SCRIPT),
}
TRACER = trace.NoOpTracerProvider().get_tracer("bench")


def machine() -> str:
    model = ""
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    mem_gib = 0.0
    try:
        mem_gib = int(Path("/proc/meminfo").read_text().split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        pass
    import os

    return f"{model or platform.processor()}, {os.cpu_count()} cores, {mem_gib:.0f} GiB, Linux {platform.release()}, Python {platform.python_version()}"


class Sample:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.elapsed = 0.0

    def stats(self) -> tuple[float, float, float]:
        """(p50 ms, p99 ms, calls/s)."""
        ordered = sorted(self.latencies)
        p99 = ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]
        return statistics.median(ordered), p99, len(ordered) / self.elapsed


async def run_batch(call: Callable[[int], Awaitable[None]], calls: int, concurrency: int, sample: Sample) -> None:
    semaphore = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with semaphore:
            started = time.perf_counter()
            await call(i)
            sample.latencies.append((time.perf_counter() - started) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(calls)))
    sample.elapsed += time.perf_counter() - started


async def compare(a: Callable[[int], Awaitable[None]], b: Callable[[int], Awaitable[None]], calls: int, concurrency: int, rounds: int = 5) -> tuple[Sample, Sample]:
    """Measure `a` and `b` in alternating rounds, so a load change on a shared machine hits both alike."""
    await a(-1)
    await b(-1)  # warm up
    first, second = Sample(), Sample()
    per_round = max(concurrency, calls // rounds)
    for _ in range(rounds):
        await run_batch(a, per_round, concurrency, first)
        await run_batch(b, per_round, concurrency, second)
    return first, second


async def plain(argv: tuple[str, ...], cwd: Path) -> None:
    # The jail's clean environment and a session of its own, as the jail gets: same start-up, and
    # the same CPU share under the kernel's autogroup scheduling (one group per session).
    env = {**clean_environment({}), "HOME": str(cwd)}
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True
    )
    await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed")


async def local_table(calls: int) -> list[tuple]:
    base = Path(tempfile.mkdtemp(prefix="agentmesh-sandbox-bench-"))
    base.chmod(0o711)
    try:
        settings = ToolsSettings.from_env({}, home=base / "home")
        workspaces = Workspaces(settings.workspace_root, jail_host_identity(settings))
        jail = LocalJail(settings, workspaces, TRACER)
        if not jail.available:
            print("bubblewrap not installed: skipping the local jail", file=sys.stderr)
            return []
        cwd = workspaces.ensure("bench")
        rows = []
        for program, argv in PROGRAMS.items():
            for concurrency in (1, 8):
                async def jailed(i: int, argv=argv) -> None:
                    result = await jail.run(CommandSpec("bench", f"c{i}", argv, 30))
                    if result.exit_code != 0:
                        raise RuntimeError(f"jailed {argv[0]} failed: {result.stderr or result.detail}")

                jail_sample, plain_sample = await compare(jailed, lambda i, argv=argv: plain(argv, cwd), calls, concurrency)
                jail_stats, plain_stats = jail_sample.stats(), plain_sample.stats()
                rows.append((program, concurrency, *jail_stats, *plain_stats, jail_stats[0] / plain_stats[0]))
        return rows
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def seccomp_table(calls: int) -> list[tuple]:
    """The seccomp filter's cost: the same jail with and without it, in the same run."""
    base = Path(tempfile.mkdtemp(prefix="agentmesh-sandbox-bench-seccomp-"))
    base.chmod(0o711)
    try:
        jails = {}
        for flag in ("true", "false"):
            settings = ToolsSettings.from_env({"AGENTMESH_SANDBOX_SECCOMP": flag}, home=base / flag)
            jails[flag] = LocalJail(settings, Workspaces(settings.workspace_root, jail_host_identity(settings)), TRACER)
        if not jails["true"].available:
            return []
        rows = []
        for program, argv in PROGRAMS.items():
            def runner(jail: LocalJail, argv=argv):
                async def call(i: int) -> None:
                    result = await jail.run(CommandSpec("bench", f"c{i}", argv, 30))
                    if result.exit_code != 0:
                        raise RuntimeError(f"jailed {argv[0]} failed: {result.stderr or result.detail}")

                return call

            on, off = await compare(runner(jails["true"]), runner(jails["false"]), calls, 1)
            rows.append((program, *on.stats(), *off.stats(), on.stats()[0] / off.stats()[0]))
        return rows
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def kubernetes_table(calls: int) -> list[tuple]:
    from kubernetes import client, watch

    from agentmesh.tools.sandbox.k8s_api import KubernetesJobs
    from agentmesh.tools.sandbox.k8s_job import build_job, job_name
    from agentmesh.tools.sandbox.kubernetes import KubernetesExecutor, api_client_for
    from agentmesh.tools.settings import KubernetesSandbox
    from tests.tools.fake_kube import FakeKube

    base = Path(tempfile.mkdtemp(prefix="agentmesh-sandbox-bench-k8s-"))
    rows = []
    try:
        with FakeKube() as fake:
            fake.instant_containers = True
            cfg = KubernetesSandbox(namespace="bench", kubeconfig=str(fake.kubeconfig(base)))
            settings = ToolsSettings.from_env({}, home=base / "home")
            api = KubernetesJobs(api_client_for(cfg), cfg.namespace)
            executor = KubernetesExecutor(api, cfg, settings.limits, None, TRACER, quota=settings.workspace_quota)
            raw = api_client_for(cfg)
            batch, core = client.BatchV1Api(raw), client.CoreV1Api(raw)

            async def through_executor(i: int) -> None:
                result = await executor.run(CommandSpec("bench", f"c{i}", ("/bin/true",), 30))
                if result.exit_code != 0 or result.error_kind:
                    raise RuntimeError(result.detail)

            def bare_sequence(i: int) -> None:
                """The least a correct client does: create, watch the pod to its end, read its log, delete."""
                name = job_name()
                batch.create_namespaced_job("bench", build_job(CommandSpec("bench", f"c{i}", ("/bin/true",), 30), cfg, name))
                pod_name = ""
                for event in watch.Watch().stream(core.list_namespaced_pod, "bench", label_selector=f"agentmesh.io/job={name}", timeout_seconds=30):
                    pod = event["object"]
                    if pod.status.phase in ("Succeeded", "Failed"):
                        pod_name = pod.metadata.name
                        break
                core.read_namespaced_pod_log(pod_name, "bench", container="sandbox")
                batch.delete_namespaced_job(name, "bench", propagation_policy="Background")

            before = len(fake.requests)
            for i in range(10):
                await through_executor(i)
            per_call = (len(fake.requests) - before) / 10
            for concurrency in (1, 8):
                ours_sample, bare_sample = await compare(through_executor, lambda i: asyncio.to_thread(bare_sequence, i), calls, concurrency)
                ours, bare = ours_sample.stats(), bare_sample.stats()
                rows.append((concurrency, *ours, *bare, ours[0] / bare[0], per_call))
            await executor.close()
            raw.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100, help="calls per measurement (default 100)")
    parser.add_argument("--skip-kubernetes", action="store_true")
    args = parser.parse_args()
    print(f"machine: {machine()}")
    print(f"bubblewrap: {subprocess.run(['bwrap', '--version'], capture_output=True, text=True).stdout.strip() if shutil.which('bwrap') else 'missing'}")
    local = asyncio.run(local_table(args.calls))
    if local:
        print(f"\nlocal jail vs plain subprocess, {args.calls} calls each (ms)")
        print(f"{'program':<8} {'conc':>4} | {'jail p50':>9} {'p99':>8} {'calls/s':>8} | {'plain p50':>9} {'p99':>8} {'calls/s':>8} | {'ratio p50':>9}")
        for program, conc, jp50, jp99, jrate, pp50, pp99, prate, ratio in local:
            print(f"{program:<8} {conc:>4} | {jp50:9.1f} {jp99:8.1f} {jrate:8.1f} | {pp50:9.1f} {pp99:8.1f} {prate:8.1f} | {ratio:8.1f}x")
    filtered = asyncio.run(seccomp_table(args.calls))
    if filtered:
        print(f"\nlocal jail with vs without the seccomp filter, 1 concurrent, {args.calls} calls each (ms)")
        print(f"{'program':<8} | {'seccomp p50':>11} {'p99':>8} {'calls/s':>8} | {'none p50':>9} {'p99':>8} {'calls/s':>8} | {'ratio p50':>9}")
        for program, sp50, sp99, srate, np50, np99, nrate, ratio in filtered:
            print(f"{program:<8} | {sp50:11.1f} {sp99:8.1f} {srate:8.1f} | {np50:9.1f} {np99:8.1f} {nrate:8.1f} | {ratio:8.2f}x")
    if not args.skip_kubernetes:
        rows = asyncio.run(kubernetes_table(max(10, args.calls // 2)))
        print(f"\nkubernetes executor on the fake API server (instant containers), {max(10, args.calls // 2)} calls each (ms)")
        print(f"{'conc':>4} | {'executor p50':>12} {'p99':>8} {'calls/s':>8} | {'bare p50':>9} {'p99':>8} {'calls/s':>8} | {'ratio':>6} | {'API requests/call':>17}")
        for conc, op50, op99, orate, bp50, bp99, brate, ratio, per_call in rows:
            print(f"{conc:>4} | {op50:12.1f} {op99:8.1f} {orate:8.1f} | {bp50:9.1f} {bp99:8.1f} {brate:8.1f} | {ratio:5.1f}x | {per_call:17.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
