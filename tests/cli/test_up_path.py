"""`agentmesh up` started in a directory that holds Python files: the services never import them.

The services are Python processes started in `up`'s working directory; were that directory on
their import path, a `secrets.py` lying there (a project's own, or a hostile checkout's) would
stand in for the standard library's module in every service.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from agentmesh.cli.stack import free_address
from agentmesh.config import SERVICES

# A stand-in for the standard library's `secrets`: it notes that it ran (the pid, in the marker
# file), then puts the real module in its place, so a service that imported it still works and
# the marker is the only sign.
HOSTILE_SECRETS = """
import os, sys, sysconfig, importlib.util
with open({marker!r}, "a") as note:
    note.write(f"{{os.getpid()}} {{sys.argv}}\\n")
spec = importlib.util.spec_from_file_location("secrets", os.path.join(sysconfig.get_path("stdlib"), "secrets.py"))
real = importlib.util.module_from_spec(spec)
spec.loader.exec_module(real)
sys.modules["secrets"] = real
"""


@pytest.mark.slow
def test_up_in_a_directory_with_a_secrets_module_never_imports_it(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    marker = tmp_path / "imported-from-cwd"
    (project / "secrets.py").write_text(HOSTILE_SECRETS.format(marker=str(marker)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTMESH_", "PYTHON"))}
    env.update({f"AGENTMESH_{name.upper()}_ADDR": free_address() for name in SERVICES})
    env.update({"AGENTMESH_HOME": str(tmp_path / "home"), "AGENTMESH_GATEWAY_HTTP_ADDR": free_address()})
    # The installed command, as a user runs it: its own directory (the venv's bin) leads its
    # path, so whatever the cwd holds can only reach the services through how `up` starts them.
    command = Path(sys.executable).with_name("agentmesh")
    child = subprocess.Popen([str(command), "up", "--logs", "files"], cwd=project, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines: list[str] = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("try: agentmesh chat"):
                break
        assert any(line.startswith("agentmesh is up") for line in lines), "".join(lines)
        # Healthy and serving: the gateway's HTTP API answers (the gRPC health checks passed to get here).
        url = f"http://{env['AGENTMESH_GATEWAY_HTTP_ADDR']}/v1/sessions"
        # The HTTP listener starts beside the gRPC server; on a loaded machine it may take a moment.
        for _ in range(60):
            try:
                answer = httpx.get(url, timeout=10)
                break
            except httpx.ConnectError:
                time.sleep(0.5)
        assert answer.json() == {"sessions": [], "next_page_token": ""}
        assert not marker.exists(), f"a service imported the cwd's secrets.py: {marker.read_text()}"
    finally:
        child.send_signal(signal.SIGINT)
        assert child.wait(timeout=60) == 0
