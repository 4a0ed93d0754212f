"""The command line answers at once: `agentmesh --help` and `agentmesh chat --help` import none of
the heavy libraries a command needs only when it runs (main.py). What they import is checked, not
how long they take: the time is benches/cli_startup.py's."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import subprocess
import sys

import pytest

from agentmesh.cli.main import COMMANDS, build_parser

# What a help text never needs: the wire (gRPC, protobuf and the generated stubs), telemetry,
# the stores' clients, service-token crypto, HTTP, Kubernetes, YAML, the services' logging.
HEAVY = ("grpc", "google.protobuf", "agentmesh.v1", "opentelemetry", "qdrant_client", "qdrant_edge", "jwt",
         "cryptography", "httpx", "kubernetes", "yaml", "structlog", "aiohttp", "mcp", "a2a")

# Runs the command as the installed `agentmesh` script does (`main()`), then names every module
# it imported, even when argparse ends it with SystemExit after printing the help.
WRAPPER = """
import sys
from agentmesh.cli.main import main
try:
    sys.exit(main())
finally:
    sys.stderr.write("\\nMODULES " + " ".join(sorted(sys.modules)) + "\\n")
"""


def modules_imported_by(*args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    result = subprocess.run([sys.executable, "-c", WRAPPER, *args], capture_output=True, text=True, timeout=60)
    listed = result.stderr.rpartition("\nMODULES ")[2].split()
    assert listed, result.stderr
    return result, set(listed)


def heavy_among(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


@pytest.mark.parametrize("args", [("--help",), ("chat", "--help")], ids=["agentmesh --help", "agentmesh chat --help"])
def test_help_imports_nothing_heavy(args):
    result, modules = modules_imported_by(*args)
    assert result.returncode == 0 and "usage: agentmesh" in result.stdout
    assert heavy_among(modules) == []


def test_help_lists_every_command_with_the_line_its_module_registers():
    """The top-level help comes from main.COMMANDS without importing the modules: it must read
    as the modules themselves would have it, whichever command's module is loaded."""
    full = build_parser().format_help()
    assert build_parser([]).format_help() == full
    for name in COMMANDS:
        assert build_parser([name]).format_help() == full, name


def command_help(parser: argparse.ArgumentParser, name: str) -> str:
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown), pytest.raises(SystemExit) as exited:
        parser.parse_args([name, "--help"])
    assert exited.value.code == 0
    return shown.getvalue()


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_command_still_has_its_own_arguments(name):
    assert command_help(build_parser([name, "--help"]), name) == command_help(build_parser(), name)


def test_the_cli_sends_the_bearer_header_the_gateway_reads():
    """common.bearer_metadata writes out rpc.auth's (importing that would bring JWT and OpenTelemetry)."""
    from agentmesh.cli.common import bearer_metadata
    from agentmesh.rpc import auth

    for token in ("", "tok-123"):
        assert bearer_metadata(token) == auth.bearer_metadata(token)


def test_a_command_that_calls_the_gateway_loads_grpc_but_not_the_services_machinery(tmp_path):
    """A plain channel (rpc/client.py without identity or tracer) costs gRPC alone: no
    OpenTelemetry, no service-token crypto, no YAML, no structured logging."""
    import socket

    with socket.socket() as probe:  # a port nothing listens on: the call fails, after the imports
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTMESH_")}
    env.update({"AGENTMESH_HOME": str(tmp_path), "AGENTMESH_GATEWAY_ADDR": address})
    result = subprocess.run([sys.executable, "-c", WRAPPER, "sessions", "list"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "cannot reach the gateway" in result.stderr
    modules = set(result.stderr.rpartition("\nMODULES ")[2].split())
    assert "grpc" in modules and "agentmesh.v1.sessions_pb2" in modules
    assert heavy_among(modules - {m for m in modules if m.startswith(("grpc", "google.protobuf", "agentmesh.v1"))}) == []
