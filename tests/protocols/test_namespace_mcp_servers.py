"""A namespace's own MCP servers (`agentmesh mcp add|list|remove`, the gateway's AddMcpServer,
ListMcpServers, RemoveMcpServer and their HTTP routes): checked before they are kept, stored
durably, and their tools in that namespace's catalog and turns only."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import grpc
import httpx
import pytest
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.tools import Tool

from agentmesh.v1 import gateway_pb2, tools_pb2
from tests.mcpservers.http_server import HttpMcpServer
from tests.protocols.conftest import TOKEN
from tests.support.llm_server import reply, tool_call
from tests.support.stack import Stack
from tests.support.turns import collect, of_kind

AUTH = (("authorization", f"Bearer {TOKEN}"),)


@pytest.fixture
def calc():
    with HttpMcpServer() as server:
        yield server


@pytest.fixture
async def stack(tmp_path, llm, calc):
    env = {"AGENTMESH_AUTH_TOKENS": TOKEN, "AGENTMESH_TOOLS_WEB_ALLOW": f"127.0.0.1:{calc.port},127.0.0.1:9"}
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=env) as running:
        yield running


def add_request(namespace: str, **server) -> tools_pb2.AddMcpServerRequest:
    return tools_pb2.AddMcpServerRequest(namespace=namespace, server=tools_pb2.McpServerSpec(**server))


async def tool_names(stack, namespace: str = "") -> set[str]:
    reply_ = await stack.gateway_stub().ListTools(tools_pb2.ListToolsRequest(namespace=namespace), metadata=AUTH)
    return {t.name for t in reply_.tools}


async def test_a_namespaces_http_server_serves_its_turns_only_and_survives_a_restart(stack, llm, calc):
    gateway = stack.gateway_stub()
    status = await gateway.AddMcpServer(add_request("team-a", name="calc", url=calc.url), metadata=AUTH, timeout=90)
    assert status.available and "calc__add" in status.tools and status.server.url == calc.url

    assert "calc__add" in await tool_names(stack, "team-a")
    assert "calc__add" not in await tool_names(stack, "team-b")
    assert "calc__add" not in await tool_names(stack)

    # A turn of a team-a session can call it; the same call in a team-b session cannot.
    await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id="a1", namespace="team-a"), metadata=AUTH)
    llm.add(reply("", tool_call("calc__add", {"a": 2, "b": 3}, id="c1")), reply("5."))
    events = await collect(gateway.Chat(gateway_pb2.ChatRequest(session_id="a1", message="add"), metadata=AUTH, timeout=60))
    result = of_kind(events, "tool_result")[0].result
    assert not result.is_error and dict(result.data["structured_content"]) == {"sum": 5}
    assert "calc__add" in {t["function"]["name"] for t in llm.requests[0].body["tools"]}

    await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id="b1", namespace="team-b"), metadata=AUTH)
    llm.add(reply("", tool_call("calc__add", {"a": 2, "b": 3}, id="c1")), reply("no."))
    events = await collect(gateway.Chat(gateway_pb2.ChatRequest(session_id="b1", message="add"), metadata=AUTH, timeout=60))
    assert of_kind(events, "tool_result")[0].result.is_error
    assert "calc__add" not in {t["function"]["name"] for t in llm.requests[2].body["tools"]}

    # Stored durably: after a restart of every service it is there again.
    await stack.restart()
    assert "calc__add" in await tool_names(stack, "team-a")
    listed = await stack.gateway_stub().ListMcpServers(tools_pb2.ListMcpServersRequest(namespace="team-a"), metadata=AUTH)
    assert [s.server.name for s in listed.servers] == ["calc"] and listed.servers[0].available

    await stack.gateway_stub().RemoveMcpServer(tools_pb2.RemoveMcpServerRequest(namespace="team-a", name="calc"), metadata=AUTH)
    assert "calc__add" not in await tool_names(stack, "team-a")


def unusable_schema_server() -> MCPServer:
    """A server built with the SDK whose one tool's input schema is not valid JSON Schema (a type
    that does not exist): a model cannot be asked to fill it."""
    def shout(text: str) -> str:
        return text.upper()

    tool = Tool.from_function(shout).model_copy(update={"parameters": {
        "type": "object", "properties": {"text": {"type": "words"}}}})
    return MCPServer("shouter", tools=[tool])


async def test_a_server_whose_tool_schema_a_model_cannot_fill_is_refused(tmp_path, llm):
    with HttpMcpServer(unusable_schema_server()) as shouter:
        env = {"AGENTMESH_AUTH_TOKENS": TOKEN, "AGENTMESH_TOOLS_WEB_ALLOW": f"127.0.0.1:{shouter.port}"}
        async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=env) as stack:
            gateway = stack.gateway_stub()
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await gateway.AddMcpServer(add_request("team-a", name="shouter", url=shouter.url), metadata=AUTH, timeout=90)
            listed = await gateway.ListMcpServers(tools_pb2.ListMcpServersRequest(namespace="team-a"), metadata=AUTH)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "tool 'shout' has an invalid input schema" in raised.value.details()
    assert "nothing was added" in raised.value.details()
    assert not listed.servers


@pytest.mark.parametrize(("server", "code", "says"), [
    ({"name": "ghost", "command": "no-such-program-here"}, grpc.StatusCode.INVALID_ARGUMENT, "was not found"),
    ({"name": "bad name", "url": "https://example.com/mcp"}, grpc.StatusCode.INVALID_ARGUMENT, "1-32 letters"),
    ({"name": "both", "url": "https://x/mcp", "command": "/bin/true"}, grpc.StatusCode.INVALID_ARGUMENT, "exactly one"),
    ({"name": "private", "url": "http://10.255.0.1:9/mcp"}, grpc.StatusCode.FAILED_PRECONDITION, "egress policy refuses"),
    ({"name": "down", "url": "http://127.0.0.1:9/mcp"}, grpc.StatusCode.FAILED_PRECONDITION, "not added: it did not start"),
    ({"name": "secret", "url": "https://x/mcp", "headers": {"A": "${HOME}"}}, grpc.StatusCode.INVALID_ARGUMENT,
     "refers to ${HOME}, a variable of the tools service's environment, which a namespace's servers may not use"),
    ({"name": "deploy", "url": "https://x/mcp", "headers": {"A": "Bearer ${AGENTMESH_MCP_SECRET_X}"}},
     grpc.StatusCode.INVALID_ARGUMENT, "put the value in a secret of namespace 'team-a'"),
])
async def test_bad_servers_are_refused_on_add_and_nothing_is_stored(stack, server, code, says):
    gateway = stack.gateway_stub()
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await gateway.AddMcpServer(add_request("team-a", **server), metadata=AUTH, timeout=90)
    assert raised.value.code() == code and says in raised.value.details()
    listed = await gateway.ListMcpServers(tools_pb2.ListMcpServersRequest(namespace="team-a"), metadata=AUTH)
    assert not listed.servers


async def test_removing_an_unknown_server_is_not_found(stack, calc):
    gateway = stack.gateway_stub()
    await gateway.AddMcpServer(add_request("team-a", name="calc", url=calc.url), metadata=AUTH, timeout=90)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await gateway.RemoveMcpServer(tools_pb2.RemoveMcpServerRequest(namespace="team-a", name="nope"), metadata=AUTH)
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    assert raised.value.details() == "namespace 'team-a' has no MCP server 'nope'; it has calc"
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await gateway.AddMcpServer(add_request("team-a", name="calc", url=calc.url), metadata=AUTH, timeout=90)
    assert raised.value.code() == grpc.StatusCode.ALREADY_EXISTS


async def test_the_http_routes_and_the_cli(stack, calc):
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=stack.http_url, headers=headers, timeout=90) as http:
        added = await http.post("/v1/namespaces/team-a/mcp/servers", json={"server": {"name": "calc", "url": calc.url}})
        assert added.status_code == 200 and "calc__add" in added.json()["tools"]
        listed = await http.get("/v1/namespaces/team-a/mcp/servers")
        assert [s["server"]["name"] for s in listed.json()["servers"]] == ["calc"]
        tools = await http.get("/v1/tools", params={"namespace": "team-a"})
        assert "calc__add" in {t["name"] for t in tools.json()["tools"]}
        gone = await http.delete("/v1/namespaces/team-a/mcp/servers/nope")
        assert gone.status_code == 404

    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTMESH_")}
    env.update(stack.env)
    env.update({f"AGENTMESH_{name.upper()}_ADDR": addr for name, addr in stack.addresses.items()})
    env["AGENTMESH_AUTH_TOKEN"] = TOKEN

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "agentmesh.cli.main", "mcp", *args], env=env,
                              capture_output=True, text=True, timeout=120)

    def cli_tools(*args):
        return subprocess.run([sys.executable, "-m", "agentmesh.cli.main", "tools", *args], env=env,
                              capture_output=True, text=True, timeout=120)

    ran = await asyncio.to_thread(cli_tools, "run", "calc__add", '{"a": 20, "b": 22}', "--namespace", "team-a")
    assert ran.returncode == 0 and "42" in ran.stdout, ran.stderr
    listed_tools = await asyncio.to_thread(cli_tools, "list", "--namespace", "team-a", "--json")
    assert "calc__add" in {t["name"] for t in json.loads(listed_tools.stdout)}
    listing = await asyncio.to_thread(cli, "list", "--namespace", "team-a", "--json")
    assert listing.returncode == 0, listing.stderr
    assert json.loads(listing.stdout)[0]["server"]["name"] == "calc"
    missing = await asyncio.to_thread(cli, "remove", "nope", "--namespace", "team-a")
    assert missing.returncode == 1 and "has no MCP server 'nope'" in missing.stderr
    removed = await asyncio.to_thread(cli, "remove", "calc", "--namespace", "team-a")
    assert removed.returncode == 0 and "removed calc" in removed.stdout
    ghost = await asyncio.to_thread(cli, "add", "ghost", "--command", "no-such-program-here")
    assert ghost.returncode == 1 and "was not found" in ghost.stderr


async def test_servers_of_an_earlier_homes_files_are_migrated_to_the_memory_service(tmp_path, llm, calc):
    """Homes of earlier versions kept a namespace's servers in mcp/namespaces/<ns>.json: on the
    first start they are registered with the memory service (nothing lost) and the file renamed."""
    home = tmp_path / "home"
    legacy = home / "mcp" / "namespaces"
    legacy.mkdir(parents=True)
    (legacy / "team-a.json").write_text(json.dumps({"mcpServers": {
        "calc": {"url": calc.url, "headers": {"X-Team": "a"}}}}))
    env = {"AGENTMESH_AUTH_TOKENS": TOKEN, "AGENTMESH_TOOLS_WEB_ALLOW": f"127.0.0.1:{calc.port}"}
    async with Stack(home, llm_base_url=llm.base_url, env=env) as stack:
        gateway = stack.gateway_stub()
        listed = await gateway.ListMcpServers(tools_pb2.ListMcpServersRequest(namespace="team-a"), metadata=AUTH)
        assert [s.server.name for s in listed.servers] == ["calc"] and listed.servers[0].available
        assert dict(listed.servers[0].server.headers) == {"X-Team": "(redacted)"}
        assert not (legacy / "team-a.json").exists() and (legacy / "team-a.json.migrated").exists()

        # A turn (which carries the namespace's version) finds it.
        await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id="a1", namespace="team-a"), metadata=AUTH)
        llm.add(reply("", tool_call("calc__add", {"a": 2, "b": 3}, id="c1")), reply("5."))
        events = await collect(gateway.Chat(gateway_pb2.ChatRequest(session_id="a1", message="add"), metadata=AUTH, timeout=60))
        assert dict(of_kind(events, "tool_result")[0].result.data["structured_content"]) == {"sum": 5}

        # Kept by the memory service: a restart has it without the file.
        await stack.restart()
        assert "calc__add" in await tool_names(stack, "team-a")


async def test_a_named_agent_is_offered_the_mcp_servers_it_lists_only(stack, llm, calc):
    from agentmesh.v1 import agents_pb2

    gateway = stack.gateway_stub()
    for name in ("calc", "other"):
        await gateway.AddMcpServer(add_request("team-a", name=name, url=calc.url), metadata=AUTH, timeout=90)
    await gateway.CreateAgent(agents_pb2.CreateAgentRequest(namespace="team-a", spec=agents_pb2.AgentSpec(
        name="adder", instructions="You add numbers.", mcp_servers=["calc"])), metadata=AUTH)
    await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id="m1", namespace="team-a"), metadata=AUTH)
    llm.add(reply("", tool_call("other__add", {"a": 2, "b": 3}, id="c1")), reply("", tool_call(
        "calc__add", {"a": 2, "b": 3}, id="c2")), reply("5."))
    events = await collect(gateway.Chat(gateway_pb2.ChatRequest(
        session_id="m1", message="add", options=gateway_pb2.ChatOptions(agent="adder")), metadata=AUTH, timeout=60))
    offered = {t["function"]["name"] for t in llm.requests[0].body["tools"]}
    assert "calc__add" in offered and "other__add" not in offered and "read_file" in offered
    refused, added = [r.result for r in of_kind(events, "tool_result")]
    assert refused.is_error and "uses the MCP servers calc only" in refused.output
    assert not added.is_error and dict(added.data["structured_content"]) == {"sum": 5}
    # Without the agent, every server of the namespace is offered.
    llm.add(reply("plain"))
    await collect(gateway.Chat(gateway_pb2.ChatRequest(session_id="m1", message="again"), metadata=AUTH, timeout=60))
    assert {"calc__add", "other__add"} <= {t["function"]["name"] for t in llm.requests[-1].body["tools"]}
