"""Issue 29 item 7, its leftovers: the jail that installs an `npx`/`uvx` entry's package is bounded
as every other jail is — its processes together by the template's memory, the package cache it
writes by a disk quota — and the cache is pruned to a ceiling, the least recently used package
first, never one a running server uses.

A package's `postinstall` script (npm runs it in the install) stands in for a hostile or huge
package: it writes or allocates what the test wants."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from agentmesh.config import ConfigError
from agentmesh.tools.mcp.packages import FETCHED_MARK
from agentmesh.tools.settings import ToolsSettings
from agentmesh.v1 import tools_pb2
from tests.mcpservers.conftest import write_servers
from tests.mcpservers.npm_registry import NAME, NpmRegistry
from tests.mcpservers.test_package_entries import egress_settings, needs_egress, needs_npm, outside_address
from tests.mcpservers.test_server_reach import execute
from tests.mcpservers.test_start_failures import run_cli
from tests.support.stack import Stack

MIB = 1024 * 1024
# Writes 48 MiB in pieces: past an 8 MiB quota, whether the watch sees it mid-way or only at the end.
WRITE_48_MIB = "node -e \"const fs=require('fs');for(let i=0;i<48;i++)fs.appendFileSync('big',Buffer.alloc(1<<20,1))\""
# Ten processes of 256 MiB each (written, so resident): together past a 2 GiB bound, each far below it.
ALLOCATE_2_5_GIB = ("for i in 1 2 3 4 5 6 7 8 9 10; do python3 -c "
                    "\"import time; b = b'x' * (256 << 20); time.sleep(300)\" & done; wait")


def cache_of(home: Path) -> Path:
    return home / "home" / "mcp" / "packages"


def snapshot(cache: Path) -> dict[str, bytes]:
    """Every path under the cache with its content (directories as b"/")."""
    return {str(p.relative_to(cache)): (b"/" if p.is_dir() else p.read_bytes()) for p in sorted(cache.rglob("*"))}


def fake_install(cache: Path, name: str, size: int, used_at: float) -> Path:
    """A finished install (as fetch.py leaves one) of `size` bytes, last used at `used_at`."""
    install = cache / name
    (install / "bin").mkdir(parents=True)
    (install / "bin" / "server").write_bytes(os.urandom(size))
    (install / FETCHED_MARK).write_text(json.dumps({"command": "bin/server", "requirements": [name]}))
    os.utime(install / FETCHED_MARK, (used_at, used_at))
    return install


async def unavailable(stack: Stack, name: str) -> str:
    listing = await stack.tools_stub().ListTools(tools_pb2.ListToolsRequest(), timeout=60)
    return {s.server.name: s.error for s in listing.unavailable_mcp_servers}.get(name, "")


def cli_said(stderr: str, name: str) -> str:
    """What `agentmesh tools list` said of the unavailable server `name`."""
    start = f"MCP server '{name}' is unavailable, its tools are missing: "
    lines = [line[len(start):] for line in stderr.splitlines() if line.startswith(start)]
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.slow
@needs_egress
@needs_npm
async def test_an_install_that_writes_past_the_cache_quota_is_stopped_and_the_cache_left_as_it_was(home):
    address = outside_address()
    cache = cache_of(home)
    fake_install(cache, "npm-earlier", 64 * 1024, time.time())
    before = snapshot(cache)
    with NpmRegistry(address, scripts={"postinstall": WRITE_48_MIB}) as registry:
        entry = {"command": "npx", "args": ["-y", NAME], "env": {"npm_config_registry": registry.url}}
        env = {**egress_settings(home, address), "AGENTMESH_MCP_SERVERS": write_servers(home / "mcp.json", {"big": entry}),
               "AGENTMESH_MCP_PACKAGE_CACHE_QUOTA_MB": "8", "AGENTMESH_MCP_PACKAGE_CACHE_MAX_MB": "4"}
        async with Stack(home / "home", env=env, services=("memory", "tools")) as stack:
            error = await unavailable(stack, "big")
            code, _, err = await run_cli(stack, "tools", "list")
        assert any(path.endswith(".tgz") for path in registry.requests)
    # The CLI asked later, maybe after a retry of the install that stopped at another size.
    assert code == 0
    for said in (error, cli_said(err, "big")):
        assert said.startswith("npx entry 'big' could not be fetched through sandbox template 'fetch' (network: "
                               "egress): it took the package cache to "), said
        assert said.endswith("MiB, past its 8.0 MiB quota, and was stopped; what it wrote was removed, the cache is as "
                             "it was. If the package is that large, raise AGENTMESH_MCP_PACKAGE_CACHE_QUOTA_MB"), said
    assert snapshot(cache) == before


@pytest.mark.slow
@needs_egress
@needs_npm
async def test_an_install_that_allocates_past_the_memory_bound_is_stopped(home):
    address = outside_address()
    cache = cache_of(home)
    with NpmRegistry(address, scripts={"postinstall": ALLOCATE_2_5_GIB}) as registry:
        entry = {"command": "npx", "args": ["-y", NAME], "env": {"npm_config_registry": registry.url}}
        env = {**egress_settings(home, address), "AGENTMESH_MCP_SERVERS": write_servers(home / "mcp.json", {"hog": entry})}
        (home / "templates.json").write_text(json.dumps({"fetch": {"network": "egress", "memory": "2Gi"}}))
        async with Stack(home / "home", env=env, services=("memory", "tools")) as stack:
            error = await unavailable(stack, "hog")
            code, _, err = await run_cli(stack, "tools", "list")
    assert error.startswith("npx entry 'hog' could not be fetched through sandbox template 'fetch' (network: egress): "
                            "its processes together used more than 2048 MiB of memory and were stopped; what it wrote "
                            "was removed; if the package's install needs more, raise sandbox template 'fetch''s memory"), error
    assert code == 0 and cli_said(err, "hog") == error, err
    assert [p.name for p in cache.iterdir()] == []


@pytest.mark.slow
async def test_a_cache_over_its_ceiling_is_pruned_at_start_the_least_recently_used_first(home):
    cache = cache_of(home)
    now = time.time()
    for name, used in (("npm-oldest", now - 3000), ("uv-older", now - 2000), ("npm-newer", now - 1000),
                       ("uv-newest", now)):
        fake_install(cache, name, 900 * 1024, used)  # with its directories and mark, under 1 MiB
    # What an interrupted install and an earlier release left: never a finished install, always removed.
    (cache / "npm-x.partial").mkdir()
    (cache / "npm-x.downloads").mkdir()
    (cache / "npm-cache" / "_cacache").mkdir(parents=True)
    (cache / "npm-cache" / "_cacache" / "blob").write_bytes(b"\0" * 1000)
    env = {"AGENTMESH_MCP_PACKAGE_CACHE_MAX_MB": "2"}
    async with Stack(home / "home", env=env, services=("memory", "tools")):
        assert sorted(p.name for p in cache.iterdir()) == ["npm-newer", "uv-newest"]


@pytest.mark.slow
@needs_egress
@needs_npm
async def test_a_server_in_use_keeps_its_package_when_another_install_prunes_the_cache(home):
    address = outside_address()
    cache = cache_of(home)
    with NpmRegistry(address) as registry:
        # Two installs of the package (another program named: another install). With a ceiling
        # of 0, each install's prune would take every package no running server holds.
        entries = {"first": {"command": "npx", "args": ["-y", NAME], "env": {"npm_config_registry": registry.url}},
                   "second": {"command": "npx", "args": ["-y", "-p", NAME, NAME],
                              "env": {"npm_config_registry": registry.url}}}
        env = {**egress_settings(home, address), "AGENTMESH_MCP_SERVERS": write_servers(home / "mcp.json", entries),
               "AGENTMESH_MCP_PACKAGE_CACHE_MAX_MB": "0", "AGENTMESH_SANDBOX_MEMORY_BYTES": str(4 * 1024**3)}
        async with Stack(home / "home", env=env, services=("memory", "tools")) as stack:
            assert (await execute(stack, "first__echo", {"text": "a"})).output == "npm says a"
            assert (await execute(stack, "second__echo", {"text": "b"})).output == "npm says b"
            installs = sorted(p.name for p in cache.iterdir())
            assert len(installs) == 2 and all(name.startswith("npm-") for name in installs), installs
        # Not in use once the service has stopped: the next start prunes them, and they are fetched again.
        registry.requests.clear()
        async with Stack(home / "home", env=env, services=("memory", "tools")) as stack:
            assert (await execute(stack, "first__echo", {"text": "c"})).output == "npm says c"
        assert sum(path.endswith(".tgz") for path in registry.requests) == 2, registry.requests


def test_a_ceiling_not_below_the_quota_stops_start_up_with_both_settings():
    settings = ToolsSettings.from_env({"AGENTMESH_MCP_PACKAGE_CACHE_QUOTA_MB": "100",
                                       "AGENTMESH_MCP_PACKAGE_CACHE_MAX_MB": "40"})
    assert (settings.mcp.package_cache_quota.limit_bytes, settings.mcp.package_cache_max_bytes) == (100 * MIB, 40 * MIB)
    with pytest.raises(ConfigError, match=r"AGENTMESH_MCP_PACKAGE_CACHE_MAX_MB \(100\) must be less than "
                                          r"AGENTMESH_MCP_PACKAGE_CACHE_QUOTA_MB \(100\)"):
        ToolsSettings.from_env({"AGENTMESH_MCP_PACKAGE_CACHE_QUOTA_MB": "100", "AGENTMESH_MCP_PACKAGE_CACHE_MAX_MB": "100"})
