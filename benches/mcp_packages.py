"""What an `npx -y` or `uvx` MCP entry's start costs: the first (its package fetched through an
egress template's jail into the cache) and the later ones (run offline from the cache), beside a
server installed in a virtual environment (the baseline), in one run.

    .venv/bin/python -m benches.mcp_packages [--first N] [--later N]

Each start is the tools service's own: its connection factory builds the opener, the supervisor
starts the server in the jail and waits until it answered `initialize` and `tools/list`. The
packages come from local stand-ins on this host's address (npm: tests/mcpservers/npm_registry.py,
a one-file Node server; PyPI: tests/mcpservers/py_index.py with the published mcp-server-time and
its dependencies as wheels, fetched by pip first), opened to the egress jail by
AGENTMESH_SANDBOX_EGRESS_ALLOW as a mirror would be. A first start gets a cache of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from opentelemetry import trace

from agentmesh.logs import configure_logging
from agentmesh.tools.mcp.config import parse_entry
from agentmesh.tools.mcp.wiring import ConnectionFactory
from agentmesh.tools.sandbox.local import LocalJail, jail_host_identity
from agentmesh.tools.settings import ToolsSettings
from agentmesh.tools.workspace import Workspaces
from benches.sandbox import machine
from benches.session_sandbox import quantile
from tests.mcpservers.npm_registry import NAME, NpmRegistry
from tests.mcpservers.py_index import PyIndex
from tests.mcpservers.test_server_reach import venv_with_the_time_server
from tests.tools.test_sandbox_templates import host_address


async def start_once(factory: ConnectionFactory, raw: dict, root: Path) -> float:
    entry = parse_entry("srv", raw, {})
    connection = factory(entry, root=root)
    started = time.perf_counter()
    try:
        await connection.start()
        if connection.error or not connection.tools:
            raise RuntimeError(f"the server did not start: {connection.error}")
        return (time.perf_counter() - started) * 1000
    finally:
        await connection.close()


def wheels_of_the_time_server(into: Path) -> Path:
    version = metadata.version("mcp-server-time")
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--dest", str(into),
                    f"mcp-server-time=={version}"], check=True, capture_output=True)
    return into


async def main(first: int, later: int) -> None:
    configure_logging("bench", "warning")
    address = host_address()
    if not address:
        raise SystemExit("this host has no address besides loopback to serve the package stand-ins on")
    base = Path(tempfile.mkdtemp(prefix="agentmesh-bench-packages-", dir="/tmp"))
    base.chmod(0o711)
    try:
        templates = base / "templates.json"
        templates.write_text(json.dumps({"fetch": {"network": "egress", "memory": "4Gi"}}))
        settings = ToolsSettings.from_env({"AGENTMESH_SANDBOX_TEMPLATES": str(templates),
                                           "AGENTMESH_SANDBOX_EGRESS_ALLOW": address,
                                           "AGENTMESH_SANDBOX_MEMORY_BYTES": str(4 * 1024**3),
                                           "AGENTMESH_MCP_CONNECT_TIMEOUT_S": "120"}, home=base / "home")
        settings.workspace_root.mkdir(parents=True)
        owner = jail_host_identity(settings)
        jail = LocalJail(settings, Workspaces(settings.workspace_root, owner), trace.get_tracer("bench"))
        factory = ConnectionFactory(settings, jail, owner)
        venv_script = venv_with_the_time_server(base)
        wheels = wheels_of_the_time_server(base / "wheels")
        with NpmRegistry(address) as registry, PyIndex(wheels, address) as index:
            entries = {
                "venv server (baseline)": {"command": str(venv_script), "args": ["--local-timezone", "UTC"]},
                "npx -y (Node, one file)": {"command": "npx", "args": ["-y", NAME],
                                            "env": {"npm_config_registry": registry.url}},
                "uvx mcp-server-time": {"command": "uvx", "args": ["mcp-server-time", "--local-timezone", "UTC"],
                                        "env": {"UV_DEFAULT_INDEX": index.url}},
            }
            print(f"{machine()}; load {os.getloadavg()[0]:.1f}; {datetime.date.today()}; "
                  f"{first} first starts and {later} later starts per entry, in alternating rounds")
            firsts: dict[str, list[float]] = {label: [] for label in entries}
            laters: dict[str, list[float]] = {label: [] for label in entries}
            for r in range(first):
                for label, raw in entries.items():
                    firsts[label].append(await start_once(factory, raw, base / f"first-{r}"))
            for _ in range(later):
                for label, raw in entries.items():
                    laters[label].append(await start_once(factory, raw, base / "first-0"))
        print(f"{'server start to tools listed':28} {'first p50 ms':>13} {'later p50 ms':>13} {'later p95 ms':>13}")
        for label in entries:
            print(f"{label:28} {statistics.median(firsts[label]):13.0f} {statistics.median(laters[label]):13.0f} "
                  f"{quantile(laters[label], 0.95):13.0f}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--first", type=int, default=3)
    parser.add_argument("--later", type=int, default=10)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.first, arguments.later))
