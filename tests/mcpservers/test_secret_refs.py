"""Secret references of MCP server entries ({"secretRef": NAME}; `mcp add --env-secret` and
`--header-secret`): resolved by the tools service from the files the operator mounts under
AGENTMESH_MCP_SECRETS_DIR, never stored as values, never listed, never seen by other jails."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from agentmesh.config import ConfigError
from agentmesh.internal.v1 import memory_service_pb2, memory_service_pb2_grpc, tools_service_pb2
from agentmesh.tools.mcp.config import parse_entry
from agentmesh.tools.mcp.secrets import SecretSource, UnknownSecret
from agentmesh.v1 import tools_pb2
from tests.mcpservers.conftest import jailable_python, write_servers
from tests.mcpservers.http_server import HttpMcpServer
from tests.support.identities import signed_channel
from tests.support.stack import Stack

TOKEN = "users-token-0123456789"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
SECRET = "Bearer s3cret-0f-team-a"


def secrets_dir(base: Path) -> Path:
    """A directory laid out as mounted Kubernetes Secrets are: files that are symlinks into ..data/."""
    root = base / "secrets"
    data = root / "..2026_11_24"
    (data / "team-a").mkdir(parents=True)
    (data / "DEPLOY_TOKEN").write_text("deploy-value\n")  # a trailing newline is not part of it
    (data / "team-a" / "CALC_TOKEN").write_text(SECRET)
    (root / "..data").symlink_to(data.name)
    (root / "DEPLOY_TOKEN").symlink_to("..data/DEPLOY_TOKEN")
    (root / "team-a").symlink_to("..data/team-a")
    return root


# --- the resolution rules -------------------------------------------------------------------

def test_the_deployments_references_read_its_files_then_its_variables(tmp_path):
    source = SecretSource(str(secrets_dir(tmp_path)), {"AGENTMESH_MCP_SECRET_FROM_ENV": "env-value"})
    entry = parse_entry("docs", {"url": "https://mcp.example.com/mcp", "headers": {
        "Authorization": {"secretRef": "DEPLOY_TOKEN", "prefix": "Bearer "},
        "X-Env": {"secretRef": "FROM_ENV"}, "X-Plain": "plain"}}, source)
    assert dict(entry.headers) == {"Authorization": "Bearer deploy-value", "X-Env": "env-value", "X-Plain": "plain"}


def test_a_namespace_reads_only_its_own_directory(tmp_path):
    source = SecretSource(str(secrets_dir(tmp_path)), {"AGENTMESH_MCP_SECRET_FROM_ENV": "env-value"})
    team_a = source.for_namespace("team-a")
    entry = parse_entry("calc", {"url": "https://x/mcp", "headers": {"Authorization": {"secretRef": "CALC_TOKEN"}}}, team_a)
    assert entry.headers["Authorization"] == SECRET
    # Not the deployment's files or variables, not another namespace's, not through "..".
    for namespace, name in (("team-a", "DEPLOY_TOKEN"), ("team-a", "FROM_ENV"), ("team-b", "CALC_TOKEN"),
                            ("..", "DEPLOY_TOKEN"), (".", "DEPLOY_TOKEN")):
        with pytest.raises(UnknownSecret, match=f"namespace '{namespace}' does not have"):
            parse_entry("calc", {"url": "https://x/mcp", "headers": {"A": {"secretRef": name}}},
                        source.for_namespace(namespace))


def test_a_namespace_cannot_substitute_the_deployments_variables(tmp_path):
    source = SecretSource(str(secrets_dir(tmp_path)), {"AGENTMESH_MCP_SECRET_FROM_ENV": "env-value"})
    literal = {"url": "https://x/mcp", "headers": {"Authorization": "Bearer ${AGENTMESH_MCP_SECRET_FROM_ENV}"}}
    assert parse_entry("docs", literal, source).headers["Authorization"] == "Bearer env-value"
    with pytest.raises(ConfigError, match="a namespace's servers may not use; put the value in a secret of "
                                          "namespace 'team-a' and refer to it \\(--header-secret\\)"):
        parse_entry("docs", literal, source.for_namespace("team-a"))
    stdio = {"command": "/bin/true", "env": {"TOKEN": "${AGENTMESH_MCP_SECRET_FROM_ENV}"}}
    with pytest.raises(ConfigError, match="--env-secret"):
        parse_entry("docs", stdio, source.for_namespace("team-a"))


@pytest.mark.parametrize(("value", "says"), [
    ({"secretRef": "../team-a/CALC_TOKEN"}, "a secret name is 1-63 letters"),
    ({"secretRef": "..data"}, "a secret name is 1-63 letters"),
    ({"secretRef": "NOPE"}, "refers to secret 'NOPE', which is not set: there is no file"),
    ({"secretRef": "DEPLOY_TOKEN", "other": 1}, 'must be a string or {"secretRef": NAME}'),
    ({"ref": "DEPLOY_TOKEN"}, "must be an object of string values or"),
])
def test_bad_references_are_clear_errors(tmp_path, value, says):
    source = SecretSource(str(secrets_dir(tmp_path)), {})
    with pytest.raises(ConfigError, match=None) as raised:
        parse_entry("docs", {"url": "https://x/mcp", "headers": {"Authorization": value}}, source)
    assert says in str(raised.value)


def test_a_secret_that_leads_outside_the_directory_is_refused(tmp_path):
    root = secrets_dir(tmp_path)
    (tmp_path / "elsewhere").write_text("host file")
    (root / "team-a" / "ESCAPE").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="leads outside AGENTMESH_MCP_SECRETS_DIR"):
        parse_entry("x", {"url": "https://x/mcp", "headers": {"A": {"secretRef": "ESCAPE"}}},
                    SecretSource(str(root)).for_namespace("team-a"))


# --- a stdio server of the deployment ---------------------------------------------------------

@pytest.mark.slow
async def test_a_stdio_servers_env_secret_reaches_it_and_no_other_jail(home):
    python = jailable_python()
    if not python:
        pytest.skip("no system python to run the server in the jail")
    import sysconfig

    site = sysconfig.get_paths()["purelib"]
    here = str(Path(__file__).parent)
    secrets = secrets_dir(home)
    (secrets / "..data" / "API_KEY").write_text("api-key-value")
    (secrets / "API_KEY").symlink_to("..data/API_KEY")
    entry = {"command": python, "args": [f"{here}/env_server.py"], "mounts": [site, here],
             "env": {"PYTHONPATH": site, "API_KEY": {"secretRef": "API_KEY"}}}
    env = {"AGENTMESH_MCP_SERVERS": write_servers(home / "mcp.json", {"env": entry}),
           "AGENTMESH_MCP_SECRETS_DIR": str(secrets)}
    async with Stack(home / "home", env=env, services=("memory", "tools")) as stack:
        tools = stack.tools_stub()

        async def call(name, arguments):
            request = tools_service_pb2.ExecuteRequest(session_id="s1", call_id="c1", name=name, arguments_json=json.dumps(arguments))
            return (await tools.Execute(request, timeout=60)).result

        assert (await call("env__getenv", {"name": "API_KEY"})).output == "api-key-value"
        # The server's jail has no view of the secrets, nor of the service's environment.
        assert (await call("env__exists", {"path": str(secrets)})).output == "no"
        assert (await call("env__getenv", {"name": "AGENTMESH_MCP_SECRETS_DIR"})).output == ""
        # Another tool's jail sees neither the directory nor the server's environment.
        shell = await call("shell", {"command": f"ls {secrets}; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c api-key-value"})
        assert "api-key-value" not in shell.output and "No such file" in shell.output


async def test_an_unknown_secret_stops_the_service_saying_where_it_looked(home):
    env = {"AGENTMESH_MCP_SERVERS": write_servers(home / "mcp.json", {"docs": {
        "url": "https://mcp.example.com/mcp", "headers": {"Authorization": {"secretRef": "MISSING"}}}}),
        "AGENTMESH_MCP_SECRETS_DIR": str(secrets_dir(home))}
    stack = Stack(home / "home", env=env, services=("memory", "tools"))
    try:
        with pytest.raises(ConfigError) as raised:
            await stack.start()
    finally:
        await stack.stop()
    assert ("MCP server 'docs': headers.Authorization refers to secret 'MISSING', which is not set: there is no "
            f"file {home / 'secrets' / 'MISSING'}, and AGENTMESH_MCP_SECRET_MISSING is not in the tools service's "
            "environment") in str(raised.value)


# --- a namespace's HTTP server (mcp add --header-secret) ---------------------------------------

@pytest.fixture
def guarded():
    with HttpMcpServer(authorization=SECRET) as server:
        yield server


async def test_a_namespaces_header_secret_is_resolved_by_the_tools_service_only(home, guarded):
    env = {"AGENTMESH_AUTH_TOKENS": TOKEN, "AGENTMESH_TOOLS_WEB_ALLOW": f"127.0.0.1:{guarded.port}",
           "AGENTMESH_MCP_SECRETS_DIR": str(secrets_dir(home))}
    async with Stack(home / "home", env=env) as stack:
        gateway = stack.gateway_stub()

        def add(namespace, **spec):
            return gateway.AddMcpServer(tools_pb2.AddMcpServerRequest(namespace=namespace, server=tools_pb2.McpServerSpec(
                name="calc", url=guarded.url, **spec)), metadata=AUTH, timeout=90)

        # Without the header the server refuses: nothing is added.
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await add("team-a")
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        # Another namespace cannot use team-a's secret, nor the deployment's.
        for namespace, name in (("team-b", "CALC_TOKEN"), ("team-a", "DEPLOY_TOKEN")):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await add(namespace, header_secrets={"Authorization": name})
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert f"refers to secret {name!r}, which namespace {namespace!r} does not have" in refused.value.details()
            assert "nothing was added" in refused.value.details()

        status = await add("team-a", header_secrets={"Authorization": "CALC_TOKEN"})
        assert status.available and "calc__add" in status.tools and SECRET in guarded.authorizations
        listed = await gateway.ListMcpServers(tools_pb2.ListMcpServersRequest(namespace="team-a"), metadata=AUTH)
        assert dict(listed.servers[0].server.header_secrets) == {"Authorization": "CALC_TOKEN"}
        assert "s3cret" not in str(listed)

        # The memory service keeps the name, not the value.
        memory = memory_service_pb2_grpc.MemoryStub(signed_channel(stack.settings.keys_dir, "tools", "memory", stack.addresses["memory"]))
        kept = await memory.ListMcpRegistrations(memory_service_pb2.ListMcpRegistrationsRequest(namespace="team-a"))
        assert dict(kept.servers[0].header_secrets) == {"Authorization": "CALC_TOKEN"} and "s3cret" not in str(kept)
        store = home / "home"
        assert not any(b"s3cret-0f-team-a" in path.read_bytes() for path in store.rglob("*") if path.is_file()
                       and "secrets" not in path.parts)

        # The command line: --header-secret, and `mcp list` naming the secret only.
        cli_env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTMESH_")}
        cli_env.update(stack.env)
        cli_env.update({f"AGENTMESH_{name.upper()}_ADDR": addr for name, addr in stack.addresses.items()})
        cli_env["AGENTMESH_AUTH_TOKEN"] = TOKEN

        def cli(*args):
            return subprocess.run([sys.executable, "-m", "agentmesh.cli.main", "mcp", *args], env=cli_env,
                                  capture_output=True, text=True, timeout=120)

        removed = await asyncio.to_thread(cli, "remove", "calc", "--namespace", "team-a")
        assert removed.returncode == 0, removed.stderr
        added = await asyncio.to_thread(cli, "add", "calc", "--url", guarded.url, "--header-secret",
                                        "Authorization=CALC_TOKEN", "--namespace", "team-a")
        assert added.returncode == 0, added.stderr
        shown = await asyncio.to_thread(cli, "list", "--namespace", "team-a")
        assert "Authorization from secret CALC_TOKEN" in shown.stdout and "s3cret" not in shown.stdout
        usage = await asyncio.to_thread(cli, "add", "x", "--command", "/bin/true", "--header-secret", "A=B")
        assert usage.returncode == 2 and "--header-secret go with --url" in usage.stderr
