"""Issue 27, stdio MCP servers in the local jail: their environment (secrets) and the service's
host paths never on a command line; a server installed in a virtual environment anywhere (here
under /tmp, which the jail replaces with its own) runs without `mounts`; and one that cannot start
is reported with what it said on its way out, not "Connection closed"."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import grpc
import pytest

from agentmesh.internal.v1 import tools_service_pb2
from agentmesh.v1 import tools_pb2
from tests.mcpservers.conftest import jailable_python, write_servers
from tests.support.processes import descendants
from tests.support.stack import Stack

pytestmark = pytest.mark.slow

SECRET = "s3cret-api-key-in-env-7f3a"
TOKEN = "users-token-0123456789"
AUTH = (("authorization", f"Bearer {TOKEN}"),)


def system_python() -> str:
    python = jailable_python()
    if not python:
        pytest.skip(f"no system python{sys.version_info.major}.{sys.version_info.minor} to run the server in the jail")
    return python


async def execute(stack, name: str, arguments: dict):
    request = tools_service_pb2.ExecuteRequest(session_id="s1", call_id="c1", name=name, arguments_json=json.dumps(arguments))
    return (await stack.tools_stub().Execute(request, timeout=60)).result


def cmdlines(pids) -> dict[int, bytes]:
    found = {}
    for pid in pids:
        try:
            found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            pass
    return found


async def test_no_secret_and_no_host_path_is_on_any_command_line(home):
    site = sysconfig.get_paths()["purelib"]
    here = str(Path(__file__).parent)
    entry = {"command": system_python(), "args": [f"{here}/env_server.py"], "mounts": [site, here],
             "env": {"PYTHONPATH": site, "API_KEY": SECRET}}
    env = {"AGENTMESH_MCP_SERVERS": write_servers(home / "mcp.json", {"env": entry})}
    async with Stack(home / "home", env=env, services=("memory", "tools")) as stack:
        assert (await execute(stack, "env__getenv", {"name": "API_KEY"})).output == SECRET  # it did get it
        # Every process of the host: none shows the secret.
        everyone = cmdlines(int(p) for p in os.listdir("/proc") if p.isdigit())
        assert not [pid for pid, line in everyone.items() if SECRET.encode() in line]
        # This test's processes (the jail's among them) show no path of the service's home.
        ours = cmdlines(descendants(os.getpid()))
        assert any(b"env_server.py" in line for line in ours.values())
        assert not [line for line in ours.values() if str(home).encode() in line]
        # Inside the jail, the server's own view of its processes (its /proc/1 is bwrap's).
        inside = (await execute(stack, "env__cmdlines", {})).output
        assert "env_server.py" in inside and SECRET not in inside and str(home) not in inside, inside


def venv_with_the_time_server(base: Path) -> Path:
    """A virtual environment under /tmp with the `mcp-server-time` console script pip would write:
    made from the system Python (symlinks to it), its packages found through a .pth file (as an
    editable install's are) in this test environment's site-packages."""
    venv = base / "venv"
    subprocess.run([system_python(), "-m", "venv", "--without-pip", str(venv)], check=True)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (venv / "lib" / version / "site-packages" / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    script = venv / "bin" / "mcp-server-time"
    script.write_text(f"#!{venv}/bin/python\nimport sys\nfrom mcp_server_time import main\nsys.exit(main())\n")
    script.chmod(0o755)
    return script


async def test_a_server_in_a_virtual_environment_under_tmp_answers_without_mounts(home):
    script = venv_with_the_time_server(home)
    assert str(script).startswith("/tmp/")
    entry = {"command": str(script), "args": ["--local-timezone", "UTC"]}
    env = {"AGENTMESH_MCP_SERVERS": write_servers(home / "mcp.json", {"time": entry})}
    async with Stack(home / "home", env=env, services=("memory", "tools")) as stack:
        result = await execute(stack, "time__get_current_time", {"timezone": "Europe/Paris"})
    assert not result.is_error, result.output
    assert json.loads(result.output)["timezone"] == "Europe/Paris"


async def test_a_command_named_on_the_services_path_runs_from_its_venv(home, monkeypatch):
    # As after `pipx install mcp-server-time` or activating a venv: the name, found on PATH.
    script = venv_with_the_time_server(home)
    monkeypatch.setenv("PATH", f"{script.parent}:{os.environ['PATH']}")
    env = {"AGENTMESH_MCP_SERVERS": write_servers(home / "mcp.json", {"time": {"command": "mcp-server-time"}})}
    async with Stack(home / "home", env=env, services=("memory", "tools")) as stack:
        result = await execute(stack, "time__get_current_time", {"timezone": "UTC"})
    assert not result.is_error, result.output


async def test_a_server_that_cannot_start_is_reported_with_its_own_reason(home):
    exits = "import sys; sys.exit('broken-server: cannot read /etc/broken-server.toml (No such file)')"
    env = {"AGENTMESH_AUTH_TOKENS": TOKEN}
    async with Stack(home / "home", env=env, services=("memory", "tools", "agent", "gateway")) as stack:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stack.gateway_stub().AddMcpServer(tools_pb2.AddMcpServerRequest(
                namespace="team-a", server=tools_pb2.McpServerSpec(name="broken", command=system_python(),
                                                                   args=["-c", exits])),
                metadata=AUTH, timeout=90)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert ("MCP server 'broken' was not added: it did not start: its process ended: broken-server: cannot read "
            "/etc/broken-server.toml (No such file)") in refused.value.details()


async def test_a_server_in_a_virtual_environment_under_opt_answers_without_mounts(home):
    try:
        base = Path(tempfile.mkdtemp(prefix="agentmesh-mcp-", dir="/opt"))
    except OSError:
        pytest.skip("/opt is not writable here")
    try:
        base.chmod(0o755)
        script = venv_with_the_time_server(base)
        env = {"AGENTMESH_MCP_SERVERS": write_servers(home / "mcp.json", {"time": {"command": str(script)}})}
        async with Stack(home / "home", env=env, services=("memory", "tools")) as stack:
            result = await execute(stack, "time__get_current_time", {"timezone": "UTC"})
        assert not result.is_error, result.output
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def test_a_server_installed_the_pipx_way_answers_by_its_name(home, monkeypatch):
    # pipx keeps one venv per application under $PIPX_HOME/venvs and links its console script
    # into a bin directory on PATH: the entry names only the command.
    venvs = home / "pipx" / "venvs" / "mcp-server-time"
    venvs.mkdir(parents=True)
    script = venv_with_the_time_server(venvs)
    bin_dir = home / "local-bin"
    bin_dir.mkdir()
    (bin_dir / "mcp-server-time").symlink_to(script)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    env = {"AGENTMESH_MCP_SERVERS": write_servers(home / "mcp.json", {"time": {"command": "mcp-server-time"}})}
    async with Stack(home / "home", env=env, services=("memory", "tools")) as stack:
        result = await execute(stack, "time__get_current_time", {"timezone": "UTC"})
    assert not result.is_error, result.output
