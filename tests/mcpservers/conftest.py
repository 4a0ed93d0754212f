from __future__ import annotations

import json
import shutil
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.mcpservers.http_server import HttpMcpServer
from tests.support.processes import descendants


def jailable_python() -> str:
    """A system Python of the running version: the jail shares /usr, not this venv's interpreter
    (which may live in a home directory the jail's user cannot enter)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return shutil.which(version, path="/usr/bin:/usr/local/bin") or ""


def time_server_entry() -> dict:
    """The unmodified `mcp-server-time` from PyPI, as installed in this environment; its packages
    are bound read-only into the jail (`mounts`)."""
    python = jailable_python()
    if not python:
        pytest.skip(f"no system python{sys.version_info.major}.{sys.version_info.minor} to run mcp-server-time in the jail")
    site = sysconfig.get_paths()["purelib"]
    return {"command": python, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
            "env": {"PYTHONPATH": site}, "mounts": [site]}


def write_servers(path: Path, servers: dict) -> str:
    path.write_text(json.dumps({"mcpServers": servers}))
    return str(path)


@pytest.fixture
def http_mcp():
    with HttpMcpServer() as server:
        yield server


@pytest.fixture
def home():
    """A home other users can traverse (as a deployment's), so a root test run still jails the
    server as an unprivileged host user."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="agentmesh-mcp-", dir="/tmp"))
    base.chmod(0o711)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def server_pids(marker: str) -> list[int]:
    """This test's processes whose command line holds `marker`, leaving out the jail's own (bwrap,
    setpriv, sh). Only descendants of this process count: the machine may be running other test
    sessions at the same time, with servers of the same name of their own."""
    pids = []
    ours = descendants()
    for pid in ours:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and marker.encode() in argv and Path(argv[0].decode(errors="replace")).name.startswith("python"):
            pids.append(pid)
    return sorted(pids)
