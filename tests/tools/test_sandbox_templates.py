"""Sandbox templates (AGENTMESH_SANDBOX_TEMPLATES) through the real tools service over gRPC with
real bubblewrap jails: listing them, choosing one per call, an unknown name refused with its
reason, a template's isolation and memory, and a `network: egress` template's user-mode network —
the internet routed, the host's loopback and private addresses not."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from agentmesh import error_reasons
from agentmesh.errors import ConfigError
from agentmesh.internal.v1 import tools_service_pb2
from agentmesh.tools.sandbox.templates import parse_templates
from agentmesh.tools.settings import ToolsSettings
from agentmesh.v1 import tools_pb2
from tests.tools.support import ToolsClient

pytestmark = pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap")
needs_slirp = pytest.mark.skipif(not (shutil.which("slirp4netns") and shutil.which("nsenter")),
                                 reason="egress needs slirp4netns and nsenter (scripts/system-packages.sh)")

TEMPLATES = {
    "templates": {
        "notebook": {"isolation": "session", "memory": "768Mi"},
        "small": {"memory": "64Mi", "disk_quota": "5Mi"},
        "web": {"network": "egress", "description": "the internet, not the host"},
        "web-notebook": {"network": "egress", "isolation": "session"},
    }
}


@pytest.fixture
async def client(home, tmp_path):
    path = tmp_path / "templates.yaml"
    path.write_text(json.dumps(TEMPLATES))
    async with ToolsClient(home, {"AGENTMESH_SANDBOX_TEMPLATES": str(path)}) as running:
        yield running


async def run(client: ToolsClient, name: str, arguments: dict, template: str = "", session_id: str = "s1",
              isolation: str = ""):
    reply = await client.stub.Execute(tools_service_pb2.ExecuteRequest(
        session_id=session_id, call_id="c1", name=name, arguments_json=json.dumps(arguments),
        sandbox_template=template, isolation=isolation), timeout=120)
    return reply.result


def host_address() -> str:
    """An address of this host that is not loopback (the source of its default route)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("203.0.113.1", 9))  # no packet is sent
        except OSError:
            return ""
        address = probe.getsockname()[0]
    return "" if address.startswith("127.") else address


@contextlib.asynccontextmanager
async def listening(host: str):
    """A TCP server on this host answering "hello from the host"; yields its port."""
    async def answer(reader, writer):
        writer.write(b"hello from the host\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, host, 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


def connect_code(address: str, port: int) -> str:
    return (f"import socket\ntry:\n    s = socket.create_connection(({address!r}, {port}), timeout=5)\n"
            f"    print('CONNECTED', s.recv(100).decode().strip())\nexcept OSError as e:\n    print('REFUSED', e)")


def test_a_template_file_is_checked_field_by_field():
    assert dict(parse_templates("gpu: {cpu: '2', memory: 8Gi, runtimeClass: nvidia}")) == {
        "gpu": {"cpu": "2", "memory": "8Gi", "runtime_class": "nvidia"}}
    for text, words in (("x: {network: open}", "network must be none or egress"),
                        ("x: {memory: lots}", "not a size"),
                        ("x: {colour: red}", "unknown field 'colour'"),
                        ("Bad_Name: {}", "template name 'Bad_Name'")):
        with pytest.raises(ConfigError, match=words):
            parse_templates(text)


async def test_the_templates_are_listed_with_default_as_todays_sandbox(client):
    reply = await client.as_gateway.ListSandboxTemplates(tools_pb2.ListSandboxTemplatesRequest(), timeout=30)
    listed = {t.name: t for t in reply.templates}
    assert list(listed) == ["default", "notebook", "small", "web", "web-notebook"]
    default = listed["default"]
    assert (default.isolation, default.network, default.memory, default.disk_quota) == ("call", "none", "1024Mi", "1024Mi")
    # What a template leaves out is the default's.
    assert (listed["notebook"].isolation, listed["notebook"].network, listed["notebook"].memory) == ("session", "none", "768Mi")
    assert listed["web"].network == "egress" and listed["web"].isolation == "call"


async def test_an_unknown_template_is_refused_with_its_reason_and_runs_nothing(client):
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await run(client, "shell", {"command": "echo ran > ran.txt"}, template="gpu")
    err = caught.value
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "no sandbox template 'gpu'" in err.details() and "default, notebook, small, web, web-notebook" in err.details()
    status = rpc_status.from_call(err)
    infos = [info for detail in status.details if detail.Unpack(info := error_details_pb2.ErrorInfo())]
    assert [(i.reason, i.metadata["template"]) for i in infos] == [(error_reasons.UNKNOWN_SANDBOX_TEMPLATE, "gpu")]
    assert not (client.workspace("s1") / "ran.txt").exists()


async def test_a_session_template_keeps_python_state_where_the_default_does_not(client):
    await run(client, "python", {"code": "x = 41"}, template="notebook")
    kept = await run(client, "python", {"code": "print(x + 1)"}, template="notebook")
    assert kept.stdout == "42\n", kept.output
    await run(client, "python", {"code": "y = 1"})
    fresh = await run(client, "python", {"code": "print(y)"})
    assert "NameError" in fresh.stderr, fresh.output


async def test_an_agents_isolation_overrides_the_templates(client):
    await run(client, "python", {"code": "x = 41"}, isolation="session", session_id="s3")
    kept = await run(client, "python", {"code": "print(x + 1)"}, isolation="session", session_id="s3")
    assert kept.stdout == "42\n", kept.output
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await run(client, "shell", {"command": "true"}, isolation="vm")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "isolation must be call or session" in caught.value.details()


async def test_a_templates_memory_and_disk_quota_bound_its_calls(client):
    grow = {"code": "b = bytearray(200 * 1024 * 1024); print('allocated')"}
    assert (await run(client, "python", grow)).stdout == "allocated\n"
    small = await run(client, "python", grow, template="small")
    assert small.is_error and "MemoryError" in small.stderr + small.output, small.output
    write = {"command": "head -c 8000000 /dev/zero > big.bin"}
    over = await run(client, "shell", write, template="small", session_id="s2")
    assert over.error_kind == "disk_quota", over.output


async def test_a_call_without_network_says_which_template_would_allow_it(client):
    offline = await run(client, "python", {"code": "import socket; socket.getaddrinfo('pypi.org', 443)"})
    assert offline.is_error
    assert "the sandbox has no network (template 'default', network: none)" in offline.output
    assert "`network: egress` would allow it: web, web-notebook" in offline.output


@needs_slirp
async def test_an_egress_sandbox_routes_the_internet_and_not_the_host_or_private_ranges(client):
    routes = await run(client, "shell", {"command": "ip route get 1.1.1.1; ip route get 10.1.2.3; ip route get 169.254.169.254"},
                       template="web")
    lines = routes.stdout + routes.stderr
    assert "1.1.1.1 via 10.0.2.2 dev tap0" in lines, routes.output  # a public address goes out
    # Private and metadata addresses have no route at all.
    assert "10.1.2.3" not in routes.stdout and "169.254.169.254" not in routes.stdout, routes.output
    metadata = await run(client, "python", {"code": connect_code("169.254.169.254", 80)}, template="web")
    assert metadata.stdout.startswith("REFUSED"), metadata.output
    # Name resolution is the user-mode network's forwarder, not the host's resolver.
    resolv = await run(client, "shell", {"command": "cat /etc/resolv.conf"}, template="web")
    assert resolv.stdout.startswith("nameserver 10.0.2.3"), resolv.output


@needs_slirp
async def test_an_egress_sandbox_cannot_reach_a_server_on_the_hosts_loopback(client):
    async with listening("127.0.0.1") as port:
        for address in ("127.0.0.1", "10.0.2.2"):  # its own loopback, and slirp's door to the host's
            reached = await run(client, "python", {"code": connect_code(address, port)}, template="web")
            assert reached.stdout.startswith("REFUSED"), (address, reached.output)


@needs_slirp
async def test_an_egress_sandbox_cannot_reach_the_hosts_private_address_unless_allowed(home, tmp_path):
    address = host_address()
    if not address:
        pytest.skip("this host has no address besides loopback")
    path = tmp_path / "templates.json"
    path.write_text(json.dumps({"web": {"network": "egress"}}))
    async with listening("0.0.0.0") as port:
        async with ToolsClient(home, {"AGENTMESH_SANDBOX_TEMPLATES": str(path)}) as blocked:
            refused = await run(blocked, "python", {"code": connect_code(address, port)}, template="web")
            assert refused.stdout.startswith("REFUSED"), refused.output
        # The same server standing in for "outside": once its address is allowed, the call goes
        # out through the user-mode network and reaches it — packets to a routed address flow.
        allowed = {"AGENTMESH_SANDBOX_TEMPLATES": str(path), "AGENTMESH_SANDBOX_EGRESS_ALLOW": address}
        async with ToolsClient(home, allowed) as opened:
            reached = await run(opened, "python", {"code": connect_code(address, port)}, template="web")
            assert reached.stdout == "CONNECTED hello from the host\n", reached.output


def test_a_bad_egress_allowance_stops_the_settings():
    with pytest.raises(ConfigError, match="loopback"):
        ToolsSettings.from_env({"AGENTMESH_SANDBOX_EGRESS_ALLOW": "127.0.0.1"})


@needs_slirp
async def test_a_session_sandbox_with_egress_keeps_its_network_and_its_limits(client):
    async with listening("127.0.0.1") as port:
        # Its interpreter keeps state, and the host's loopback stays out of reach from it.
        await run(client, "python", {"code": "import socket"}, template="web-notebook", session_id="n1")
        code = connect_code("10.0.2.2", port).replace("import socket\n", "")
        reached = await run(client, "python", {"code": code}, template="web-notebook", session_id="n1")
        assert reached.stdout.startswith("REFUSED"), reached.output
    routes = await run(client, "shell", {"command": "ip route get 1.1.1.1; ip route get 192.168.1.1"},
                       template="web-notebook", session_id="n1")
    assert "1.1.1.1 via 10.0.2.2 dev tap0" in routes.stdout and "192.168.1.1" not in routes.stdout, routes.output
