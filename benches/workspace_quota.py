"""Workspace quota: what measuring a workspace costs, what it adds to a call, and how far a fast
writer gets past the quota before it is stopped.

    .venv/bin/python -m benches.workspace_quota [--runs N]

1. Measuring: `quota.workspace_usage` (the service's walk) beside `du -skx` (what a pod's wrapper
   runs), on workspaces of 100 to 100,000 small files, p50 of repeated runs in the same process.
2. Per call: `true` through `LocalJail.run` on an empty workspace and on ones of 1,000 and 10,000
   files, in alternating rounds; the difference is the two walks (before and after) a call makes.
3. Overshoot in the jail: a 256 MiB quota with a 256 MiB per-file limit, writers that each stay
   under that limit: one writer of 60 MiB files one after the other, and four of them at once.
   The overshoot is what the workspace holds past the quota when the call has been stopped.
4. Overshoot in a pod: the same writers under the pod's wrapper (`k8s_quota.py`), run here as a
   plain process in a directory, as the tests' fake kubelet does.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agentmesh.tools.quota import workspace_usage
from agentmesh.tools.sandbox.base import CommandSpec
from agentmesh.tools.sandbox.k8s_quota import quota_command
from agentmesh.tools.sandbox.local import LocalJail, jail_host_identity
from agentmesh.tools.settings import MIB, ToolsSettings
from agentmesh.tools.workspace import Workspaces
from benches.sandbox import TRACER, compare, machine

QUOTA = 256 * MIB
WRITERS = {
    "one writer, 60 MiB files": "for i in $(seq 1 16); do head -c 60M /dev/zero > f$i || exit 1; done",
    "four writers at once": "for j in 1 2 3 4; do (for i in $(seq 1 8); do head -c 60M /dev/zero > f$j-$i || exit 1; done) & done; wait",
}


def fill(directory: Path, files: int) -> None:
    """`files` files of 1 KiB, 1,000 to a directory."""
    for i in range(files):
        sub = directory / f"d{i // 1000}"
        sub.mkdir(exist_ok=True)
        (sub / f"f{i}").write_bytes(b"x" * 1024)


def alternating(first, second, reps: int) -> tuple[float, float]:
    """p50 ms of `first` and of `second`, run in turn so load changes hit both alike."""
    a, b = [], []
    for _ in range(reps):
        for fn, samples in ((first, a), (second, b)):
            started = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(a), statistics.median(b)


def measuring_table(base: Path) -> list[tuple]:
    rows = []
    for files in (100, 1_000, 10_000, 100_000):
        directory = base / f"w{files}"
        directory.mkdir()
        fill(directory, files)
        reps = 20 if files <= 10_000 else 7
        walk, du = alternating(
            lambda directory=directory: workspace_usage(directory),
            lambda directory=directory: subprocess.run(["du", "-skx", "."], cwd=directory, capture_output=True, check=True),
            reps,
        )
        rows.append((files, walk, du))
        shutil.rmtree(directory)
    return rows


async def per_call_table(base: Path, calls: int) -> list[tuple]:
    settings = ToolsSettings.from_env({}, home=base / "home")
    workspaces = Workspaces(settings.workspace_root, jail_host_identity(settings))
    jail = LocalJail(settings, workspaces, TRACER)
    if not jail.available:
        return []
    rows = []
    for files in (1_000, 10_000):
        fill(workspaces.ensure(f"full{files}"), files)
        workspaces.ensure("empty")

        async def on(session: str, i: int) -> None:
            result = await jail.run(CommandSpec(session, f"c{i}", ("/bin/true",), 30))
            if result.exit_code != 0:
                raise RuntimeError(result.stderr)

        empty, full = await compare(lambda i: on("empty", i), lambda i, f=files: on(f"full{f}", i), calls, 1)
        rows.append((files, empty.stats()[0], full.stats()[0]))
    return rows


async def jail_overshoot(base: Path, runs: int) -> list[tuple]:
    env = {"AGENTMESH_TOOLS_WORKSPACE_QUOTA_MB": str(QUOTA // MIB), "AGENTMESH_SANDBOX_FILE_SIZE_BYTES": str(QUOTA)}
    settings = ToolsSettings.from_env(env, home=base / "jail")
    workspaces = Workspaces(settings.workspace_root, jail_host_identity(settings))
    jail = LocalJail(settings, workspaces, TRACER)
    if not jail.available:
        return []
    rows = []
    for name, command in WRITERS.items():
        overshoots, rates = [], []
        for run in range(runs):
            session = f"o{run}"
            started = time.perf_counter()
            result = await jail.run(CommandSpec(session, "c", ("/bin/sh", "-c", command), 60))
            elapsed = time.perf_counter() - started
            used = workspace_usage(workspaces.path(session))
            if result.error_kind != "disk_quota":
                raise RuntimeError(f"{name}: not stopped ({result.error_kind or result.exit_code})")
            overshoots.append(max(used - QUOTA, 0) / MIB)
            rates.append(used / MIB / elapsed)
            workspaces.delete(session)
        rows.append((name, statistics.median(rates), statistics.median(overshoots), max(overshoots)))
    return rows


def pod_overshoot(base: Path, runs: int) -> list[tuple]:
    rows = []
    for name, command in WRITERS.items():
        overshoots, rates = [], []
        for run in range(runs):
            directory = base / f"pod{run}"
            directory.mkdir()
            started = time.perf_counter()
            done = subprocess.run(quota_command(("/bin/sh", "-c", command), QUOTA, QUOTA), cwd=directory, capture_output=True)
            elapsed = time.perf_counter() - started
            used = workspace_usage(directory)
            if done.returncode != 122:
                raise RuntimeError(f"{name}: not stopped ({done.returncode})")
            overshoots.append(max(used - QUOTA, 0) / MIB)
            rates.append(used / MIB / elapsed)
            shutil.rmtree(directory)
        rows.append((name, statistics.median(rates), statistics.median(overshoots), max(overshoots)))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per writer for the overshoot tables")
    parser.add_argument("--calls", type=int, default=60, help="jail calls per workspace size")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="agentmesh-quota-bench-", dir="/tmp"))
    base.chmod(0o711)
    try:
        print(f"machine: {machine()}\n")
        print("measuring a workspace (p50, ms)")
        print("| files | workspace_usage | du -skx |\n| ---: | ---: | ---: |")
        for files, walk, du in measuring_table(base):
            print(f"| {files:,} | {walk:.2f} | {du:.2f} |")
        rows = asyncio.run(per_call_table(base, args.calls))
        if rows:
            print("\njail call of `true` (p50, ms): empty workspace vs one of N files")
            print("| files | empty | N files | added |\n| ---: | ---: | ---: | ---: |")
            for files, empty, full in rows:
                print(f"| {files:,} | {empty:.1f} | {full:.1f} | {full - empty:+.1f} |")
        rows = asyncio.run(jail_overshoot(base, args.runs))
        if rows:
            print(f"\njail: overshoot past a {QUOTA // MIB} MiB quota ({args.runs} runs)")
            print("| writer | rate (MiB/s) | overshoot p50 (MiB) | overshoot max (MiB) |\n| --- | ---: | ---: | ---: |")
            for name, rate, p50, worst in rows:
                print(f"| {name} | {rate:.0f} | {p50:.1f} | {worst:.1f} |")
        print(f"\npod wrapper: overshoot past a {QUOTA // MIB} MiB quota ({args.runs} runs)")
        print("| writer | rate (MiB/s) | overshoot p50 (MiB) | overshoot max (MiB) |\n| --- | ---: | ---: | ---: |")
        for name, rate, p50, worst in pod_overshoot(base, args.runs):
            print(f"| {name} | {rate:.0f} | {p50:.1f} | {worst:.1f} |")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
