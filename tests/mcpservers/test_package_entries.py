"""Issue 29 item 7: `npx -y PKG` and `uvx PKG` entries as people write them — the package fetched
once through a sandbox template with `network: egress` into a cache, the server then run offline
from that cache; and without such a template, a sentence saying which setting would fetch it.

The registries are local stand-ins on this host's own (non-loopback) address, which the egress
jail may reach only because AGENTMESH_SANDBOX_EGRESS_ALLOW opens it — as a package mirror on a
private address is opened in a deployment; the public registries would be routed the same way
(tests/tools/test_sandbox_templates.py shows the route)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from agentmesh.config import ConfigError
from agentmesh.tools.mcp.packages import PackageSpec, package_runner
from agentmesh.v1 import tools_pb2
from tests.mcpservers.conftest import write_servers
from tests.mcpservers.npm_registry import NAME, NpmRegistry
from tests.mcpservers.py_index import PyIndex
from tests.mcpservers.test_server_reach import AUTH, TOKEN, execute
from tests.mcpservers.test_start_failures import run_cli
from tests.support.processes import descendants
from tests.support.stack import Stack
from tests.tools.test_sandbox_templates import host_address

needs_egress = pytest.mark.skipif(
    not (shutil.which("bwrap") and shutil.which("slirp4netns") and shutil.which("nsenter")),
    reason="egress needs bubblewrap, slirp4netns and nsenter (scripts/system-packages.sh)")
needs_npm = pytest.mark.skipif(not shutil.which("npm", path="/usr/bin:/bin"), reason="no npm in /usr/bin (Debian's npm)")
# Node's V8 reserves more address space than the jail's default 1 GiB bound sometimes allows.
NODE_MEMORY = {"AGENTMESH_SANDBOX_MEMORY_BYTES": str(4 * 1024**3)}


def test_npx_and_uvx_entries_name_the_package_they_install_and_the_program_they_run():
    assert package_runner("e", "npx", ("-y", "@modelcontextprotocol/server-everything", "stdio")) == PackageSpec(
        "npx", ("@modelcontextprotocol/server-everything",), "", ("stdio",))
    assert package_runner("e", "/usr/bin/npx", ("--yes", "--package=srv@2", "srv-stdio", "--flag")) == PackageSpec(
        "npx", ("srv@2",), "srv-stdio", ("--flag",))
    assert package_runner("t", "uvx", ("mcp-server-time@2026.1.1", "--local-timezone", "UTC")) == PackageSpec(
        "uvx", ("mcp-server-time==2026.1.1",), "mcp-server-time", ("--local-timezone", "UTC"))
    assert package_runner("t", "uvx", ("--from", "mcp-server-git[x]>=1", "--with", "gitpython", "mcp-server-git")) == \
        PackageSpec("uvx", ("mcp-server-git[x]>=1", "gitpython"), "mcp-server-git", ())
    assert package_runner("t", "/usr/bin/python3", ("-m", "x")) is None
    with pytest.raises(ConfigError, match="uvx option '--python' is not understood here"):
        package_runner("t", "uvx", ("--python", "3.12", "mcp-server-time"))
    with pytest.raises(ConfigError, match="npx names no package"):
        package_runner("e", "npx", ("-y",))
    # The same package from another registry is another install.
    spec = package_runner("e", "npx", ("-y", "x"))
    assert spec is not None and spec.key({}) != spec.key({"npm_config_registry": "http://mirror/"})
    assert spec.key({}) == spec.key({"UNRELATED": "1"})


def egress_settings(home: Path, address: str) -> dict[str, str]:
    templates = home / "templates.json"
    templates.write_text(json.dumps({"fetch": {"network": "egress", "memory": "4Gi"}}))
    return {"AGENTMESH_SANDBOX_TEMPLATES": str(templates), "AGENTMESH_SANDBOX_EGRESS_ALLOW": address}


def server_interfaces(marker: str) -> list[list[str]]:
    """The network interfaces each of this test's interpreters (node, python) running `marker` sees
    (not the jail's own bwrap, whose command line names the program too)."""
    seen = []
    for pid in descendants():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if not (os.path.basename(argv[0]).startswith((b"node", b"python")) and marker.encode() in b" ".join(argv)):
                continue
            lines = Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]
        except OSError:
            continue
        seen.append(sorted(line.split(":")[0].strip() for line in lines))
    return seen


def outside_address() -> str:
    address = host_address()
    if not address:
        pytest.skip("this host has no address besides loopback to stand in for the outside")
    return address


@pytest.mark.slow
@needs_egress
@needs_npm
async def test_an_npx_entry_is_fetched_once_through_an_egress_template_and_runs_offline(home):
    address = outside_address()
    with NpmRegistry(address) as registry:
        entry = {"command": "npx", "args": ["-y", NAME], "env": {"npm_config_registry": registry.url}}
        servers = write_servers(home / "mcp.json", {"echo": entry})
        env = {**NODE_MEMORY, **egress_settings(home, address), "AGENTMESH_MCP_SERVERS": servers}
        async with Stack(home / "home", env=env, services=("memory", "tools")) as stack:
            assert (await execute(stack, "echo__echo", {"text": "hi"})).output == "npm says hi"
            # The server itself has no network: its namespace holds only a loopback.
            assert server_interfaces(NAME) == [["lo"]], server_interfaces(NAME)
        assert any(path.endswith(".tgz") for path in registry.requests)
        cache = home / "home" / "mcp" / "packages"
        assert [p.name.startswith("npm-") and p.suffix == "" for p in cache.iterdir()] == [True], list(cache.iterdir())

        # Restarted (the same home), with the registry there but not asked: it runs from the cache.
        registry.requests.clear()
        async with Stack(home / "home", env=env, services=("memory", "tools")) as stack:
            assert (await execute(stack, "echo__echo", {"text": "again"})).output == "npm says again"
        assert not registry.requests


@pytest.mark.slow
@needs_npm
async def test_an_npx_entry_without_an_egress_template_says_which_setting_fetches_it(home):
    with NpmRegistry() as registry:
        entry = {"command": "npx", "args": ["-y", NAME], "env": {"npm_config_registry": registry.url}}
        env = {"AGENTMESH_MCP_SERVERS": write_servers(home / "mcp.json", {"echo": entry})}
        async with Stack(home / "home", env=env, services=("memory", "tools")) as stack:
            listing = await stack.tools_stub().ListTools(tools_pb2.ListToolsRequest(), timeout=60)
            code, _, err = await run_cli(stack, "tools", "list")
        assert not registry.requests
    error = {s.server.name: s.error for s in listing.unavailable_mcp_servers}.get("echo", "")
    assert error.startswith("npx entry 'echo' could not be fetched: no sandbox template allows egress"), error
    assert "add a template with `network: egress` to AGENTMESH_SANDBOX_TEMPLATES" in error
    assert code == 0 and f"MCP server 'echo' is unavailable, its tools are missing: {error}" in err, err


@pytest.mark.slow
@needs_egress
@needs_npm
async def test_a_namespaces_npx_server_is_installed_into_that_namespaces_own_cache(home):
    address = outside_address()
    with NpmRegistry(address) as registry:
        # A namespace's entry has no literal environment: the registry is one of its secrets.
        (home / "secrets" / "team-a").mkdir(parents=True)
        (home / "secrets" / "team-a" / "REGISTRY").write_text(registry.url)
        env = {**NODE_MEMORY, **egress_settings(home, address), "AGENTMESH_AUTH_TOKENS": TOKEN,
               "AGENTMESH_MCP_SECRETS_DIR": str(home / "secrets")}
        async with Stack(home / "home", env=env, services=("memory", "tools", "agent", "gateway")) as stack:
            server = tools_pb2.McpServerSpec(name="echo", command="npx", args=["-y", NAME],
                                             env_secrets={"npm_config_registry": "REGISTRY"})
            await stack.gateway_stub().AddMcpServer(tools_pb2.AddMcpServerRequest(namespace="team-a", server=server),
                                                    metadata=AUTH, timeout=120)
            listed = await stack.gateway_stub().ListMcpServers(tools_pb2.ListMcpServersRequest(namespace="team-a"),
                                                               metadata=AUTH, timeout=60)
            assert [(s.server.name, s.available, list(s.tools)) for s in listed.servers] == [
                ("echo", True, ["echo__echo"])], listed
    # Only the install: its downloads went with the install's end (package_cache.py).
    installs = sorted(p.relative_to(home / "home") for p in (home / "home").rglob("npm-*"))
    assert len(installs) == 1 and installs[0].parts[-3:-1] == ("team-a.servers", "packages"), installs


@pytest.fixture(scope="module")
def time_server_wheels(tmp_path_factory) -> Path:
    """The published mcp-server-time (the version installed here) and its dependencies, as wheels
    for this Python (what /usr/bin/python3 of the jail is in CI), from PyPI or pip's cache."""
    wheels = tmp_path_factory.mktemp("wheels")
    version = metadata.version("mcp-server-time")
    downloaded = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--dest", str(wheels),
         f"mcp-server-time=={version}"], capture_output=True, text=True, timeout=600)
    if downloaded.returncode != 0:
        pytest.skip(f"the wheels of mcp-server-time could not be downloaded: {downloaded.stderr[-500:]}")
    return wheels


@pytest.mark.slow
@needs_egress
async def test_a_uvx_entry_is_installed_once_through_an_egress_template_and_runs_offline(home, time_server_wheels):
    if sys.version_info[:2] != tuple(int(p) for p in os.path.realpath("/usr/bin/python3").split("python")[-1].split(".")[:2]):
        pytest.skip("the wheels are for this Python, and the jail's /usr/bin/python3 is another")
    address = outside_address()
    with PyIndex(time_server_wheels, address) as index:
        entry = {"command": "uvx", "args": ["mcp-server-time", "--local-timezone", "UTC"],
                 "env": {"UV_DEFAULT_INDEX": index.url}}
        env = {**egress_settings(home, address), "AGENTMESH_MCP_SERVERS": write_servers(home / "mcp.json", {"time": entry})}
        async with Stack(home / "home", env=env, services=("memory", "tools")) as stack:
            result = await execute(stack, "time__get_current_time", {"timezone": "Europe/Paris"})
            assert not result.is_error, result.output
            assert json.loads(result.output)["timezone"] == "Europe/Paris"
            assert server_interfaces("mcp-server-time") == [["lo"]], server_interfaces("mcp-server-time")
        assert any(path.endswith(".whl") for path in index.requests)
        cache = home / "home" / "mcp" / "packages"
        assert [p.name.startswith("uv-") and p.suffix == "" for p in cache.iterdir()] == [True], list(cache.iterdir())

        index.requests.clear()
        async with Stack(home / "home", env=env, services=("memory", "tools")) as stack:
            assert not (await execute(stack, "time__get_current_time", {"timezone": "UTC"})).is_error
        assert not index.requests


@pytest.mark.slow
@needs_egress
@needs_npm
async def test_a_fetch_longer_than_the_start_wait_does_not_hold_the_service_back(home):
    address = outside_address()
    with NpmRegistry(address) as registry:
        registry.gate.clear()  # the package's download hangs until released
        entry = {"command": "npx", "args": ["-y", NAME], "env": {"npm_config_registry": registry.url}}
        env = {**NODE_MEMORY, **egress_settings(home, address), "AGENTMESH_MCP_CONNECT_TIMEOUT_S": "3",
               "AGENTMESH_MCP_SERVERS": write_servers(home / "mcp.json", {"echo": entry})}
        async with Stack(home / "home", env=env, services=("memory", "tools")) as stack:
            listing = await stack.tools_stub().ListTools(tools_pb2.ListToolsRequest(), timeout=60)
            error = {s.server.name: s.error for s in listing.unavailable_mcp_servers}.get("echo", "")
            assert error.startswith("it is still starting (an npx or uvx entry's first start installs its package)"), error
            registry.gate.set()
            while "echo__echo" not in {t.name for t in (await stack.tools_stub().ListTools(
                    tools_pb2.ListToolsRequest(), timeout=60)).tools}:
                await asyncio.sleep(0.2)
            assert (await execute(stack, "echo__echo", {"text": "late"})).output == "npm says late"
