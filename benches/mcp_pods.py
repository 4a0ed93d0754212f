"""A stdio MCP server as a pod reached over `pods/attach`, beside the same server as a plain child
process: what the attach transport costs per call and per start.

    .venv/bin/python -m benches.mcp_pods [--calls N] [--starts N]

Both sides run the unmodified `mcp-server-time` (PyPI) and the SDK's `ClientSession`; only the
transport differs: `PodServer.open` (create the pod on the tests' fake API server, follow it to
running, attach over a websocket in the v5 channel protocol, newline-delimited JSON-RPC over the
channels) against the SDK's own `stdio_client` on a local process (no jail: the least any stdio
client does). Per call: `tools/call get_current_time`, p50/p99 and calls per second at 1 and 8
concurrent calls, alternating rounds in one run. Per start: open + `initialize` + `tools/list`.

The fake API server is a Python thread-per-request server on the same cores and its kubelet runs
the container as a local process, so "pod" here is our transport plus a websocket relay in the
same machine; a cluster adds scheduling, the image pull and the network hops through the API
server and the kubelet, which this does not measure.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Callable

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from agentmesh.tools.mcp.config import McpServerEntry
from agentmesh.tools.mcp.pod_opener import PodServer
from agentmesh.tools.sandbox.k8s_api import KubernetesJobs
from agentmesh.tools.sandbox.kubernetes import api_client_for
from agentmesh.tools.settings import KubernetesSandbox
from benches.sandbox import Sample, compare, machine
from tests.tools.fake_kube import FakeKube

ARGS = ("-m", "mcp_server_time", "--local-timezone", "UTC")
Opener = Callable[[], AbstractAsyncContextManager[tuple[Any, Any]]]


async def start_once(opener: Opener) -> float:
    started = time.perf_counter()
    async with opener() as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        await session.list_tools()
        return (time.perf_counter() - started) * 1000


async def starts(pod: Opener, plain: Opener, count: int) -> tuple[list[float], list[float]]:
    pods, plains = [], []
    for _ in range(count):
        pods.append(await start_once(pod))
        plains.append(await start_once(plain))
    return pods, plains


async def calls(pod: Opener, plain: Opener, count: int, concurrency: int) -> tuple[Sample, Sample]:
    async with pod() as (pr, pw), ClientSession(pr, pw) as pod_session, plain() as (lr, lw), ClientSession(lr, lw) as plain_session:
        await pod_session.initialize()
        await plain_session.initialize()

        def caller(session: ClientSession):
            async def call(i: int) -> None:
                result = await session.call_tool("get_current_time", {"timezone": "UTC"})
                if result.is_error:
                    raise RuntimeError(str(result.content))
            return call

        return await compare(caller(pod_session), caller(plain_session), count, concurrency)


async def main(call_count: int, start_count: int) -> None:
    directory = Path(tempfile.mkdtemp(prefix="agentmesh-mcp-bench-"))
    with FakeKube() as fake:
        cfg = KubernetesSandbox(kubeconfig=str(fake.kubeconfig(directory)), namespace="bench", memory_limit="1Gi")
        api = KubernetesJobs(api_client_for(cfg), cfg.namespace)
        entry = McpServerEntry(name="time", command=sys.executable, args=ARGS)
        errlog = open(directory / "stderr.log", "a")  # noqa: SIM115 - the bench's lifetime
        pod = PodServer(entry, api, cfg, (65534, 65534), "bench", "", errlog).opener
        parameters = StdioServerParameters(command=sys.executable, args=list(ARGS))

        def plain() -> AbstractAsyncContextManager[tuple[Any, Any]]:
            return stdio_client(parameters, errlog=errlog)

        print(f"machine: {machine()}")
        pod_starts, plain_starts = await starts(pod, plain, start_count)
        print(f"\nstart (open + initialize + tools/list), {start_count} each, alternating")
        print("| transport | p50 | max |\n| --- | ---: | ---: |")
        for label, values in (("pod over pods/attach (fake API server)", pod_starts), ("plain child process", plain_starts)):
            ordered = sorted(values)
            print(f"| {label} | {ordered[len(ordered) // 2]:.0f} ms | {ordered[-1]:.0f} ms |")

        print(f"\ntools/call get_current_time, {call_count} calls per cell, alternating rounds")
        print("| concurrent | pod p50 | p99 | calls/s | plain p50 | p99 | calls/s | ratio (p50) |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for concurrency in (1, 8):
            pod_sample, plain_sample = await calls(pod, plain, call_count, concurrency)
            a, b = pod_sample.stats(), plain_sample.stats()
            print(f"| {concurrency} | {a[0]:.2f} ms | {a[1]:.2f} ms | {a[2]:.0f} | {b[0]:.2f} ms | {b[1]:.2f} ms | {b[2]:.0f} | {a[0] / b[0]:.2f}x |")
        errlog.close()
        await api.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--starts", type=int, default=5)
    options = parser.parse_args()
    asyncio.run(main(options.calls, options.starts))
