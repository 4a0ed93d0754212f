"""Issue 29 item 7: an `mcpServers` entry that cannot start says why, in one sentence with the fix,
in the service's warning, in ListTools (`agentmesh tools list`) and in AddMcpServer/ListMcpServers
(`agentmesh mcp add|list`) — from real commands that fail in the real jail."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys

import grpc
import pytest

from agentmesh.v1 import tools_pb2
from tests.mcpservers.conftest import write_servers
from tests.mcpservers.npm_registry import NAME, NpmRegistry
from tests.mcpservers.test_server_reach import AUTH, TOKEN, execute, system_python, venv_with_the_time_server
from tests.observability.obs_helpers import capture_logs
from tests.support.stack import Stack

pytestmark = pytest.mark.slow


async def run_cli(stack: Stack, *args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTMESH_")}
    env.update(stack.env)
    env.update({f"AGENTMESH_{name.upper()}_ADDR": addr for name, addr in stack.addresses.items()})
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "agentmesh.cli.main", *args, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode(), err.decode()


def script(path, first_line: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{first_line}\nprint('never reached')\n")
    path.chmod(0o755)
    return str(path)


async def test_deployment_servers_that_cannot_start_say_why_and_what_to_change(home):
    stack_home = home / "home"
    crash = "import sys; print('srv: loading plugins', file=sys.stderr); import agentmesh_no_such_plugin"
    servers = {
        # Exits at once: its stderr's last lines (the traceback's end) are the reason.
        "crash": {"command": system_python(), "args": ["-c", crash]},
        # Its command lies in the service's own home, which is never bound into a jail.
        "hidden": {"command": script(stack_home / "servers" / "bin" / "srv", f"#!{system_python()}")},
        # A script whose #! line asks /usr/bin/env for a program the jail does not have.
        "envless": {"command": script(home / "opt" / "bin" / "srv", "#!/usr/bin/env agentmesh-no-such-interpreter")},
    }
    env = {"AGENTMESH_MCP_SERVERS": write_servers(home / "mcp.json", servers)}
    with capture_logs("tools", level="warning") as logs:
        async with Stack(stack_home, env=env, services=("memory", "tools")) as stack:
            listing = await stack.tools_stub().ListTools(tools_pb2.ListToolsRequest(), timeout=60)
            code, _, err = await run_cli(stack, "tools", "list")
    down = {s.server.name: s.error for s in listing.unavailable_mcp_servers}
    assert set(down) == {"crash", "hidden", "envless"}, down
    assert down["crash"].startswith("its process ended: "), down["crash"]
    assert "ModuleNotFoundError: No module named 'agentmesh_no_such_plugin'" in down["crash"]
    assert "Connection closed" not in down["crash"]
    hidden = servers["hidden"]["command"]
    assert down["hidden"].startswith(f"command {hidden} not found in the sandbox: it lies in the service's home "
                                     f"({stack_home}), which is never bound into a jail on its own"), down
    assert f"`mounts` (\"mounts\": [\"{os.path.dirname(os.path.dirname(hidden))}\"])" in down["hidden"]
    assert "there is no agentmesh-no-such-interpreter on the sandbox's PATH" in down["envless"], down
    # `agentmesh tools list` says the same, and the service's warning too.
    assert code == 0, err
    for name, error in down.items():
        assert f"MCP server {name!r} is unavailable, its tools are missing: {error}" in err
    warned = {line.get("server"): line.get("error") for line in logs.lines() if line.get("event") == "MCP server unavailable at start"}
    assert warned == down


async def test_a_namespace_server_outside_what_the_jail_shares_is_refused_with_where_to_install_it(home):
    command = venv_with_the_time_server(home)  # under /tmp: on the host, not in a namespace's jail
    env = {"AGENTMESH_AUTH_TOKENS": TOKEN}
    async with Stack(home / "home", env=env, services=("memory", "tools", "agent", "gateway")) as stack:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stack.gateway_stub().AddMcpServer(tools_pb2.AddMcpServerRequest(
                namespace="team-a", server=tools_pb2.McpServerSpec(name="time", command=str(command))),
                metadata=AUTH, timeout=90)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert (f"MCP server 'time' was not added: it did not start: command {command} not found in the sandbox: "
            "a namespace's server sees only the host's /usr, /bin, /lib and /etc; install it under /usr/local") \
        in refused.value.details(), refused.value.details()


@pytest.mark.skipif(not shutil.which("npx", path="/usr/bin:/bin"), reason="no npx in /usr/bin (Debian's npm)")
async def test_an_npx_server_with_network_is_fetched_once_then_starts_from_its_cache_without(home):
    """The registry is a local stand-in (tests/mcpservers/npm_registry.py): reached through the
    host's network, which `"network": true` shares, as npm's public registry would be. (Without
    it, an egress template fetches: tests/mcpservers/test_package_entries.py.)"""
    # Node's V8 reserves more address space than the jail's default 1 GiB bound sometimes allows
    # ("JavaScript heap out of memory" now and then): Node servers want a larger bound.
    memory = {"AGENTMESH_SANDBOX_MEMORY_BYTES": str(4 * 1024**3)}
    with NpmRegistry() as registry:
        def servers(network: bool) -> dict:
            entry = {"command": "npx", "args": ["-y", NAME], "env": {"npm_config_registry": registry.url}}
            return {"echo": {**entry, "network": network}} if network else {"echo": entry}

        env = {**memory, "AGENTMESH_MCP_SERVERS": write_servers(home / "online.json", servers(True))}
        async with Stack(home / "home", env=env, services=("memory", "tools")) as stack:
            assert (await execute(stack, "echo__echo", {"text": "hi"})).output == "npm says hi"
        assert any(path.endswith(".tgz") for path in registry.requests)

        # The same home, no network and no egress template: it starts from what the first start installed.
        registry.requests.clear()
        env = {**memory, "AGENTMESH_MCP_SERVERS": write_servers(home / "offline.json", servers(False))}
        async with Stack(home / "home", env=env, services=("memory", "tools")) as stack:
            result = await execute(stack, "echo__echo", {"text": "again"})
        assert result.output == "npm says again", result.output
        assert not registry.requests
