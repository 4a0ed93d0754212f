"""The command line's contract where no stack is needed: usage errors, unreachable services, taken ports."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest


def agentmesh(*args: str, env: dict[str, str], timeout: float = 60, stdin: str | None = None):
    return subprocess.run(
        [sys.executable, "-m", "agentmesh.cli.main", *args],
        env=env, capture_output=True, text=True, timeout=timeout, input=stdin,
    )


@pytest.fixture
def env(tmp_path):
    base = {k: v for k, v in os.environ.items() if not k.startswith("AGENTMESH_")}
    base["AGENTMESH_HOME"] = str(tmp_path / "home")
    return base


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unknown_command_is_a_usage_error(env):
    result = agentmesh("frobnicate", env=env)
    assert result.returncode == 2
    assert "invalid choice" in result.stderr


def test_bad_tool_arguments_json_is_a_usage_error(env):
    result = agentmesh("tools", "run", "shell", "{not json", env=env)
    assert result.returncode == 2
    assert "ARGS_JSON is not valid JSON" in result.stderr


def test_bad_configuration_is_a_usage_error(env):
    result = agentmesh("chat", "hi", env={**env, "AGENTMESH_SANDBOX": "docker"})
    assert result.returncode == 2
    assert "AGENTMESH_SANDBOX must be one of local, kubernetes" in result.stderr


def test_chat_without_a_gateway_says_how_to_start_one(env):
    port = _free_port()
    result = agentmesh("chat", "hello", env={**env, "AGENTMESH_GATEWAY_ADDR": f"127.0.0.1:{port}"})
    assert result.returncode == 1
    assert f"cannot reach the gateway service at 127.0.0.1:{port}" in result.stderr
    assert "agentmesh up" in result.stderr
    assert "Traceback" not in result.stderr


def test_up_refuses_when_a_port_is_taken_and_starts_nothing(env):
    ports = {name: _free_port() for name in ("gateway", "agent", "tools", "memory", "scheduler")}
    addrs = {f"AGENTMESH_{n.upper()}_ADDR": f"127.0.0.1:{p}" for n, p in ports.items()}
    addrs["AGENTMESH_GATEWAY_HTTP_ADDR"] = f"127.0.0.1:{_free_port()}"  # not the default every run shares
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", ports["tools"]))
        holder.listen()
        result = agentmesh("up", env={**env, **addrs})
    assert result.returncode == 1
    assert f"tools 127.0.0.1:{ports['tools']}" in result.stderr
    assert "already in use" in result.stderr
    # Nothing was started: every other port is still free.
    for name, port in ports.items():
        if name != "tools":
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", port))


def _time_wait_on(port: int) -> None:
    """Leave `port` as a stopped server leaves it: no listener, and a connection the server side
    closed first, so that side sits in TIME-WAIT for a minute."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen()
        client = socket.create_connection(("127.0.0.1", port))
        served, _ = listener.accept()
        served.close()  # the server closes first: its end of the connection enters TIME-WAIT
        client.recv(1)
        client.close()


def test_a_port_left_in_time_wait_by_a_stopped_stack_is_free_and_a_listening_one_is_not():
    from agentmesh.cli.stack import port_is_free

    port = _free_port()
    _time_wait_on(port)
    assert port_is_free(f"127.0.0.1:{port}")
    with socket.socket() as holder:  # a server listening again (gRPC binds with SO_REUSEADDR)
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", port))
        holder.listen()
        assert not port_is_free(f"127.0.0.1:{port}")
