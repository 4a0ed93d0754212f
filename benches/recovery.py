"""Recovery after a crash: kill -9 one service of a running stack, start it again, and time how
long until a turn succeeds again — per service, before and after bounded reconnect backoff.

The five services run as `agentmesh serve` processes (as `agentmesh up` runs them). A client
keeps starting turns from the moment of the kill, as users would; each turn makes two model
calls and one sandboxed `shell` call, so it needs gateway, agent, memory and tools. For the
scheduler the "turn" is a manual `TriggerJob` run, which the scheduler sends through the gateway.

Measured per service (median and worst of `--repeats` kills):
- **restart**: from starting the new process to its health check reporting SERVING;
- **recovery**: from SERVING to the end of the first turn that succeeds — the time the rest of
  the stack needs to use the restarted service again, plus one turn's own length (printed
  above the table; target: ≤ 1 s).

`--baseline-python` runs the services with another checkout's interpreter (e.g. main's
`.venv/bin/python`, before this change) in the same run, and its client on a channel with
gRPC's default options, as main's was.

    python -m benches.recovery [--repeats 3] [--down-s 3] [--baseline-python ../main/.venv/bin/python]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentmesh.cli.stack import LocalStack, free_address
from agentmesh.config import SERVICES
from agentmesh.rpc.client import open_channel
from agentmesh.v1 import gateway_pb2, gateway_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from tests.support.llm_server import ScriptedLLMServer, reply, tool_call

ATTEMPT_TIMEOUT_S = 30.0
GIVE_UP_S = 90.0


def respond(request):
    """Ask for `shell: echo ok` first; answer once the tool result is back."""
    if request.body["messages"][-1]["role"] == "tool":
        return reply("done", chunk_chars=64)
    return reply("", tool_call("shell", {"command": "echo ok"}), chunk_chars=64)


class Client:
    def __init__(self, stack: LocalStack, baseline: bool):
        address = stack.settings.address_of
        if baseline:  # main's client: gRPC's default reconnect backoff, calls fail while connecting
            self.channels = [grpc.aio.insecure_channel(address("gateway")), grpc.aio.insecure_channel(address("scheduler"))]
        else:
            self.channels = [open_channel(address("gateway")), open_channel(address("scheduler"))]
        self.gateway = gateway_pb2_grpc.GatewayStub(self.channels[0])
        self.scheduler = scheduler_pb2_grpc.SchedulerStub(self.channels[1])
        self.job_id = ""

    async def close(self) -> None:
        for channel in self.channels:
            await channel.close()

    async def turn(self) -> bool:
        request = gateway_pb2.ChatRequest(session_id="recovery", message="check")
        ok = False
        try:
            async for event in self.gateway.Chat(request, timeout=ATTEMPT_TIMEOUT_S):
                kind = event.WhichOneof("payload")
                if kind == "error" or (kind == "tool_result" and event.tool_result.result.is_error):
                    return False
                ok = ok or kind == "run_finished"
        except grpc.aio.AioRpcError:
            return False
        return ok

    async def scheduled_turn(self) -> bool:
        try:
            if not self.job_id:
                job = scheduler_pb2.Job(name="recovery", schedule="daily 03:00", prompt="check")
                self.job_id = (await self.scheduler.CreateJob(scheduler_pb2.CreateJobRequest(job=job), timeout=10)).job_id
            run = await self.scheduler.TriggerJob(scheduler_pb2.TriggerJobRequest(job_id=self.job_id),
                                                  timeout=ATTEMPT_TIMEOUT_S)
            deadline = time.monotonic() + ATTEMPT_TIMEOUT_S
            while run.status == "running" and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
                runs = await self.scheduler.ListRuns(scheduler_pb2.ListRunsRequest(job_id=self.job_id, limit=5),
                                                     timeout=10)
                run = next((r for r in runs.runs if r.run_id == run.run_id), run)
            return run.status == "succeeded"
        except grpc.aio.AioRpcError:
            return False


async def until_success(attempt, pause_s: float = 0.05) -> float:
    """Keep attempting; the monotonic time at which the first successful attempt ended."""
    give_up = time.monotonic() + GIVE_UP_S
    while time.monotonic() < give_up:
        if await attempt():
            return time.monotonic()
        await asyncio.sleep(pause_s)
    raise RuntimeError(f"no successful turn within {GIVE_UP_S:.0f}s")


async def wait_serving(stack: LocalStack, name: str) -> float:
    """The moment `name` first answers its health check: a fresh connection every 20 ms, so no
    channel's reconnect backoff delays the observation."""
    address = stack.settings.address_of(name)
    give_up = time.monotonic() + 60
    while time.monotonic() < give_up:
        if stack.children[name].poll() is not None:
            raise RuntimeError(f"the {name} service exited during start-up; see {stack.log_dir}")
        async with grpc.aio.insecure_channel(address) as channel:
            try:
                reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=0.5)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return time.monotonic()
            except grpc.aio.AioRpcError:
                pass
        await asyncio.sleep(0.02)
    raise RuntimeError(f"the {name} service did not report SERVING within 60s")


async def measure(stack: LocalStack, client: Client, name: str, down_s: float) -> tuple[float, float]:
    attempt = client.scheduled_turn if name == "scheduler" else client.turn
    assert await attempt(), "the stack does not run a turn before the kill"
    child = stack.children[name]
    child.kill()
    await asyncio.to_thread(child.wait)
    # Clients keep trying from the kill on; their failures are what makes channels back off.
    trying = asyncio.create_task(until_success(attempt))
    await asyncio.sleep(down_s)  # down for a while, as during a crash loop or a slow restart
    started = time.monotonic()
    stack.spawn(name)
    serving = await wait_serving(stack, name)
    succeeded = await trying
    return serving - started, max(0.0, succeeded - serving)


async def healthy_turn_s(client: Client, turns: int = 5) -> float:
    times = []
    for _ in range(turns):
        started = time.monotonic()
        assert await client.turn()
        times.append(time.monotonic() - started)
    return statistics.median(times)


async def run_mode(python: str, baseline: bool, args, llm_url: str, home: Path) -> dict[str, list[tuple[float, float]]]:
    env = {**os.environ, "AGENTMESH_HOME": str(home), "AGENTMESH_LLM_PROVIDER": "openai",
           "AGENTMESH_LLM_BASE_URL": llm_url, "AGENTMESH_LLM_MODEL": "bench", "AGENTMESH_LOG_LEVEL": "warning",
           "AGENTMESH_DRAIN_S": "2"}
    env.update({f"AGENTMESH_{name.upper()}_ADDR": free_address() for name in SERVICES})
    stack = LocalStack(env, log_dir=home / "logs", python=python, tied_to_parent=not baseline)
    stack.start()
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in SERVICES}
    client = Client(stack, baseline)
    try:
        await stack.wait_healthy()
        results["one turn"] = [(0.0, await healthy_turn_s(client))]
        for _ in range(args.repeats):
            for name in SERVICES:
                results[name].append(await measure(stack, client, name, args.down_s))
                print(f"  {'before' if baseline else 'after'} {name}: restart {results[name][-1][0]:.2f}s, "
                      f"recovery {results[name][-1][1]:.2f}s", file=sys.stderr, flush=True)
    finally:
        await client.close()
        await asyncio.to_thread(stack.stop)
    return results


def cell(samples: list[float]) -> str:
    return f"{statistics.median(samples):.2f} / {max(samples):.2f}"


async def main_async(args) -> None:
    home = Path(tempfile.mkdtemp(prefix="agentmesh-bench-recovery-"))
    os.chmod(home, 0o755)
    with ScriptedLLMServer(default=respond) as llm:
        modes = {}
        if args.baseline_python:
            modes["before"] = await run_mode(args.baseline_python, True, args, llm.base_url, home / "before")
        modes["after"] = await run_mode(sys.executable, False, args, llm.base_url, home / "after")

    print(f"kill -9 one service, {args.down_s:g} s down, start it again; {args.repeats} kills per service; "
          "median / worst, seconds")
    print("one turn when all is well: " + ", ".join(f"{mode} {m['one turn'][0][1]:.2f} s" for mode, m in modes.items()))
    print()
    header = "| service | restart → SERVING |" + "".join(f" SERVING → turn ok ({mode}) |" for mode in modes)
    print(header)
    print("|" + " --- |" * (2 + len(modes)))
    for name in SERVICES:
        restart = [r for mode in modes.values() for r, _ in mode[name]]
        row = f"| {name} | {cell(restart)} |" + "".join(f" {cell([s for _, s in mode[name]])} |" for mode in modes.values())
        print(row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--down-s", type=float, default=3.0, help="how long the killed service stays down")
    parser.add_argument("--baseline-python", default="",
                        help="interpreter of a checkout to compare with (its services and a default-options client)")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
