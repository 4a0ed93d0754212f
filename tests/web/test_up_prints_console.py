"""`agentmesh up` prints the web console's address, and the console is there."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from agentmesh.cli.stack import free_address
from agentmesh.config import SERVICES


@pytest.mark.slow
def test_up_prints_the_console_url_that_serves_the_console(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTMESH_")}
    env.update({f"AGENTMESH_{name.upper()}_ADDR": free_address() for name in SERVICES})
    env.update({"AGENTMESH_HOME": str(tmp_path / "home"), "AGENTMESH_GATEWAY_HTTP_ADDR": free_address()})
    child = subprocess.Popen([sys.executable, "-m", "agentmesh.cli.main", "up", "--logs", "files"],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines: list[str] = []
        deadline = time.monotonic() + 90
        url = None
        while url is None and time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break
            lines.append(line)
            if match := re.search(r"console\s+(http://\S+)", line):
                url = match.group(1)
        assert url == f"http://{env['AGENTMESH_GATEWAY_HTTP_ADDR']}/", "".join(lines)
        try:
            page = httpx.get(url, timeout=10)
        except httpx.TransportError as err:
            # Seen once in a loaded full run (connection refused after the URL was printed): say
            # what the stack and the gateway said by then, so the next one can be explained.
            log = tmp_path / "home" / "logs" / "gateway.log"
            tail = log.read_text()[-4000:] if log.exists() else "(no gateway log)"
            pytest.fail(f"{err!r}; up exited: {child.poll()}; up said:\n{''.join(lines)}\ngateway log:\n{tail}")
        assert page.status_code == 200 and "<title>agentmesh</title>" in page.text
        assert httpx.get(url + "v1/sessions", timeout=10).json() == {"sessions": [], "next_page_token": ""}
    finally:
        child.send_signal(signal.SIGINT)
        child.wait(timeout=60)


def test_up_refuses_when_the_console_port_is_taken(tmp_path):
    import socket

    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTMESH_")}
    env.update({f"AGENTMESH_{name.upper()}_ADDR": free_address() for name in SERVICES})
    env["AGENTMESH_HOME"] = str(tmp_path / "home")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        env["AGENTMESH_GATEWAY_HTTP_ADDR"] = f"127.0.0.1:{holder.getsockname()[1]}"
        result = subprocess.run([sys.executable, "-m", "agentmesh.cli.main", "up"], env=env,
                                capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert f"gateway HTTP {env['AGENTMESH_GATEWAY_HTTP_ADDR']}" in result.stderr
    assert "AGENTMESH_GATEWAY_HTTP_ADDR" in result.stderr
