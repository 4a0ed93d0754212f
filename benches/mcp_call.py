"""What an MCP tool call costs through the tools service, against a built-in tool.

    python -m benches.mcp_call

One tools service (and the memory service it registers namespaces' servers with), on real gRPC
ports, called as the agent calls it (`Execute`, signed service token):

1. Per call, p50 and p99: `list_dir` (built in, in-process: the baseline), `shell` running
   `true` (built in, one bubblewrap jail per call), `time__get_current_time` (the unmodified
   `mcp-server-time` from PyPI, one long-lived process in the jail, over stdio) and `calc__add`
   (a streamable-HTTP server built with the `mcp` SDK, uvicorn on loopback), both declared in
   AGENTMESH_MCP_SERVERS; and `calc__add` again as a namespace's own server (`AddMcpServer`).
2. What a namespace's own servers add to a turn's `ListTools`: with the namespace's
   mcp_servers_version (what a turn passes; the replica has read it), without it (the replica
   reads the registrations from the memory service on each call), and the deployment's catalog
   alone (the baseline).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from agentmesh.internal.v1 import memory_service_pb2_grpc, tools_service_pb2, tools_service_pb2_grpc
from agentmesh.v1 import sessions_pb2, tools_pb2
from tests.mcpservers.conftest import time_server_entry, write_servers
from tests.mcpservers.http_server import HttpMcpServer
from tests.support.identities import signed_channel
from tests.support.stack import Stack

CALLS = 300
JAIL_CALLS = 60  # a jail per call is ~100x slower: fewer rounds


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


async def timed(call, rounds: int) -> list[float]:
    for _ in range(5):  # warm: connections open, servers started
        await call()
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="agentmesh-bench-mcp-", dir="/tmp") as base, HttpMcpServer() as calc:
        home = Path(base)
        home.chmod(0o711)  # the jail's host user must traverse it, as in a deployment
        servers = {"time": time_server_entry(), "calc": {"url": calc.url}}
        env = {"AGENTMESH_MCP_SERVERS": write_servers(home / "mcp.json", servers),
               "AGENTMESH_TOOLS_WEB_ALLOW": f"127.0.0.1:{calc.port}", "AGENTMESH_LOG_LEVEL": "error",
               "AGENTMESH_TRACES": "none", "AGENTMESH_GATEWAY_HTTP_ADDR": "off"}
        async with Stack(home / "home", env=env, services=("memory", "tools")) as stack:
            tools = stack.tools_stub()  # as the agent
            as_gateway = tools_service_pb2_grpc.ToolsStub(signed_channel(stack.settings.keys_dir, "gateway", "tools",
                                                                 stack.addresses["tools"]))
            await as_gateway.AddMcpServer(tools_pb2.AddMcpServerRequest(
                namespace="team-a", server=tools_pb2.McpServerSpec(name="nscalc", url=calc.url)), timeout=90)
            memory = memory_service_pb2_grpc.MemoryStub(signed_channel(stack.settings.keys_dir, "gateway", "memory",
                                                               stack.addresses["memory"]))
            version = (await memory.GetNamespaceSettings(
                sessions_pb2.GetNamespaceSettingsRequest(namespace="team-a"))).mcp_servers_version

            def execute(name: str, arguments: dict, namespace: str = "", known: float | None = None):
                request = tools_service_pb2.ExecuteRequest(session_id="bench", call_id="c", name=name,
                                                   arguments_json=json.dumps(arguments), namespace=namespace,
                                                   mcp_servers_version=known)

                async def call():
                    result = (await tools.Execute(request, timeout=60)).result
                    assert not result.is_error, result.output
                return call

            def list_tools(namespace: str, known: float | None):
                async def call():
                    await tools.ListTools(tools_pb2.ListToolsRequest(namespace=namespace, mcp_servers_version=known))
                return call

            calls = [
                ("list_dir (built in, baseline)", execute("list_dir", {"path": "."}), CALLS),
                ("shell `true` (built in, a jail per call)", execute("shell", {"command": "true"}), JAIL_CALLS),
                ("time__get_current_time (stdio, in the jail)", execute("time__get_current_time", {"timezone": "UTC"}), CALLS),
                ("calc__add (streamable HTTP)", execute("calc__add", {"a": 1, "b": 2}), CALLS),
                ("nscalc__add (a namespace's, HTTP)", execute("nscalc__add", {"a": 1, "b": 2}, "team-a", version), CALLS),
            ]
            print(f"{'Execute, per call':46} {'p50 ms':>8} {'p99 ms':>8}")
            for label, call, rounds in calls:
                p50, p99 = percentiles(await timed(call, rounds))
                print(f"{label:46} {p50:8.2f} {p99:8.2f}")

            catalogs = [
                ("deployment's tools only (baseline)", list_tools("", None)),
                ("+ team-a's servers, version known (a turn)", list_tools("team-a", version)),
                ("+ team-a's servers, version not passed", list_tools("team-a", None)),
            ]
            print(f"\n{'ListTools':46} {'p50 ms':>8} {'p99 ms':>8}")
            for label, call in catalogs:
                p50, p99 = percentiles(await timed(call, CALLS))
                print(f"{label:46} {p50:8.2f} {p99:8.2f}")


if __name__ == "__main__":
    asyncio.run(main())
