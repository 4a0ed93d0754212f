"""Scheduler benchmarks: firing precision on the real clock, and the cost of 10,000 jobs.

    .venv/bin/python -m benches.scheduler [--seconds 20] [--jobs 10000]

1. Precision. Jobs on `every 1s` run for a bounded time against a gRPC gateway served here
   (answers at once). Lateness = when the Chat call reached the gateway minus the due time.
   Baseline, measured in the same run and loop: how late a bare `asyncio.sleep` to the same
   kind of deadline wakes up — the floor no scheduler on this event loop can beat.
2. Holding 10,000 enabled jobs (none due during the measurement): resident memory, database
   size, the cost of one idle tick of the firing loop (the indexed due-jobs query plus the
   next-due lookup), and process CPU per second of wall time while idle, each against the same
   scheduler holding no jobs. Then the cost per job of a tick where 500 jobs are due at once.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import grpc

from agentmesh.config import Settings
from agentmesh.scheduler.model import Job
from agentmesh.scheduler.server import build
from agentmesh.telemetry import setup_telemetry
from agentmesh.v1 import common_pb2, gateway_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc


class InstantGateway(gateway_pb2_grpc.GatewayServicer):
    def __init__(self):
        self.arrivals: list[tuple[str, float]] = []  # (session id, wall time)

    async def Chat(self, request, context):
        self.arrivals.append((request.session_id, time.time()))
        yield common_pb2.Event(session_id=request.session_id, seq=1,
                               run_started=common_pb2.RunStarted(session_id=request.session_id, trace_id="0" * 32))
        yield common_pb2.Event(session_id=request.session_id, seq=2,
                               run_finished=common_pb2.RunFinished(final_text="ok", stop_reason="completed"))


def machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{model}, {os.cpu_count()} cores, {mem_gib:.0f} GiB, Python {platform.python_version()}"


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def row(*cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


async def start_scheduler(home: Path, gateway_target: str, env: dict[str, str] | None = None):
    base = Settings.from_env({"AGENTMESH_HOME": str(home), "AGENTMESH_TRACES": "none", "AGENTMESH_DRAIN_S": "1",
                              "AGENTMESH_LOG_LEVEL": "warning", **(env or {})})
    settings = dataclasses.replace(base, addresses={**base.addresses, "gateway": gateway_target})
    host = await build(settings, setup_telemetry("scheduler", settings), "127.0.0.1:0")
    await host.start()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while not host.scheduler.is_leader:
        assert loop.time() < deadline, "the scheduler never became leader"
        await asyncio.sleep(0.01)
    return host


async def sleep_baseline(samples: int) -> list[float]:
    """Lateness of a bare asyncio sleep to the next whole second plus a fraction, in ms."""
    late = []
    for i in range(samples):
        deadline = time.time() + 0.05 + (i % 7) * 0.01
        await asyncio.sleep(max(0.0, deadline - time.time()))
        late.append((time.time() - deadline) * 1000)
    return late


async def precision(gateway: InstantGateway, target: str, seconds: float, jobs: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        host = await start_scheduler(Path(tmp), target)
        channel = grpc.aio.insecure_channel(host.target)
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        ids = []
        for i in range(jobs):
            job = await stub.CreateJob(scheduler_pb2.CreateJobRequest(job=scheduler_pb2.Job(
                name=f"tick-{i}", schedule="every 1s", prompt="tick", concurrency_policy="allow")))
            ids.append(job.job_id)
        gateway.arrivals.clear()
        await asyncio.sleep(seconds)
        runs = []
        for job_id in ids:
            runs += (await stub.ListRuns(scheduler_pb2.ListRunsRequest(job_id=job_id, limit=500))).runs
        await channel.close()
        await host.stop(grace=1)
        host.telemetry.shutdown()
    arrived = dict(gateway.arrivals)
    late_ms = [(arrived[r.session_id] - r.scheduled_for) * 1000 for r in runs if r.session_id in arrived]
    keys = [(r.job_id, r.scheduled_for) for r in runs]
    return {
        "jobs": jobs, "runs": len(runs), "late_ms": late_ms,
        "duplicates": len(keys) - len(set(keys)),
        "expected": jobs * int(seconds),
        "catch_up": sum(r.trigger == "catch_up" for r in runs),
    }


async def hold_jobs(target: str, count: int) -> dict:
    """Cost of a scheduler holding `count` enabled jobs, none due."""
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        rss_before = rss_mib()
        host = await start_scheduler(home, target)
        core, store = host.scheduler, host.scheduler._store  # noqa: SLF001 - the bench measures internals
        now = time.time()
        for i in range(count):
            # Spread over a day so the index has real work; none falls due while we measure.
            due = now + 3600 + (i * 86400 / max(count, 1))
            await store.create_job(Job(job_id=f"job-{i:06d}", name=f"job {i}", schedule="every 1d",
                                       prompt="summarise the day", created_at=now, updated_at=now,
                                       anchor_at=due - 86400, next_run_at=due))
        await asyncio.sleep(1.0)
        rss_after = rss_mib()
        tick_ms = []
        for _ in range(200):
            t0 = time.perf_counter()
            await core.fire_due(time.time())
            await store.next_due_at()
            tick_ms.append((time.perf_counter() - t0) * 1000)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        await asyncio.sleep(5.0)
        idle_cpu = (time.process_time() - cpu0) / (time.perf_counter() - wall0) * 100
        db_mib = sum(p.stat().st_size for p in (home / "scheduler").glob("scheduler.db*")) / 2**20
        await host.stop(grace=1)
        host.telemetry.shutdown()
    return {"jobs": count, "rss_delta": rss_after - rss_before, "db_mib": db_mib,
            "tick_ms": statistics.median(tick_ms), "tick_p99": pct(tick_ms, 0.99), "idle_cpu": idle_cpu}


async def burst(gateway: InstantGateway, target: str, count: int) -> dict:
    """One tick where `count` jobs are due at the same instant: claim + launch cost per job."""
    with tempfile.TemporaryDirectory() as tmp:
        host = await start_scheduler(Path(tmp), target, {"AGENTMESH_SCHEDULER_POLL_S": "3600"})
        core, store = host.scheduler, host.scheduler._store  # noqa: SLF001 - the bench measures internals
        now = time.time()
        due = now + 3600  # in the future, so the live loop leaves them alone; fired by hand below
        for i in range(count):
            await store.create_job(Job(job_id=f"burst-{i:05d}", name="b", schedule="every 1d", prompt="p",
                                       created_at=now, updated_at=now, anchor_at=due - 86400, next_run_at=due,
                                       concurrency_policy="allow"))
        gateway.arrivals.clear()
        t0 = time.perf_counter()
        fired = await core.fire_due(due)
        tick_s = time.perf_counter() - t0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while core.active_runs and loop.time() < deadline:
            await asyncio.sleep(0.01)
        all_done_s = time.perf_counter() - t0
        await host.stop(grace=1)
        host.telemetry.shutdown()
    return {"due": fired, "tick_ms_per_job": tick_s * 1000 / max(fired, 1), "all_done_s": all_done_s,
            "reached_gateway": len(gateway.arrivals)}


async def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benches.scheduler")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long each precision run lasts")
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs held for the cost measurement")
    options = parser.parse_args()

    from agentmesh.logs import configure_logging

    configure_logging("scheduler", "warning")
    servicer = InstantGateway()
    server = grpc.aio.server()
    gateway_pb2_grpc.add_GatewayServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    target = f"127.0.0.1:{port}"

    print(f"machine: {machine()}\n")
    print(f"## Firing precision: `every 1s` jobs for {options.seconds:.0f} s, real clock\n")
    print(row("scenario", "runs / expected", "duplicates", "p50 ms", "p95 ms", "p99 ms", "max ms"))
    print(row(*["---"] * 7))
    baseline = await sleep_baseline(200)
    print(row("baseline: bare asyncio.sleep to a deadline", f"{len(baseline)} / 200", "-",
              f"{pct(baseline, .5):.2f}", f"{pct(baseline, .95):.2f}", f"{pct(baseline, .99):.2f}", f"{max(baseline):.2f}"))
    for jobs in (1, 10, 100):
        result = await precision(servicer, target, options.seconds, jobs)
        late = result["late_ms"]
        print(row(f"{jobs} job(s), due to gateway arrival", f"{result['runs']} / ~{result['expected']}",
                  result["duplicates"], f"{pct(late, .5):.2f}", f"{pct(late, .95):.2f}", f"{pct(late, .99):.2f}",
                  f"{max(late):.2f}"))

    print(f"\n## Holding {options.jobs:,} enabled jobs (none due), against an empty scheduler\n")
    print(row("jobs", "RSS growth MiB", "database MiB", "idle tick p50 ms", "idle tick p99 ms", "idle CPU %"))
    print(row(*["---"] * 6))
    for count in (0, options.jobs):
        held = await hold_jobs(target, count)
        print(row(f"{held['jobs']:,}", f"{held['rss_delta']:.1f}", f"{held['db_mib']:.2f}", f"{held['tick_ms']:.3f}",
                  f"{held['tick_p99']:.3f}", f"{held['idle_cpu']:.2f}"))

    print("\n## One tick with many jobs due at once\n")
    print(row("due at once", "claim+launch ms per job", "all runs finished s", "reached gateway"))
    print(row(*["---"] * 4))
    for count in (100, 500):
        result = await burst(servicer, target, count)
        print(row(result["due"], f"{result['tick_ms_per_job']:.2f}", f"{result['all_done_s']:.2f}",
                  result["reached_gateway"]))
    await server.stop(0)


if __name__ == "__main__":
    asyncio.run(main())
