"""A namespace's own MCP servers with two tools replicas behind one deployment: each replica has a
home of its own (no shared disk); the registrations live in the memory service, and the version
the gateway passes with each turn tells a replica when to read them again."""

from __future__ import annotations

import dataclasses
import json

import pytest

from agentmesh.config import Settings
from agentmesh.internal.v1 import memory_service_pb2, memory_service_pb2_grpc, tools_service_pb2, tools_service_pb2_grpc
from agentmesh.rpc.launch import start_service
from agentmesh.v1 import gateway_pb2, gateway_pb2_grpc, sessions_pb2, tools_pb2
from tests.mcpservers.http_server import HttpMcpServer
from tests.protocols.conftest import TOKEN
from tests.support.identities import caller_channel, signed_channel
from tests.support.llm_server import reply, tool_call
from tests.support.turns import collect, of_kind

AUTH = (("authorization", f"Bearer {TOKEN}"),)


@pytest.fixture
def calc():
    with HttpMcpServer() as server:
        yield server


class TwoToolsReplicas:
    """memory; tools replicas A and B (homes of their own, one key set); the gateway reaching A
    (AddMcpServer, ListMcpServers, RemoveMcpServer, ListTools) and the agent reaching B (turns)."""

    def __init__(self, tmp_path, llm_base_url: str, extra_env: dict[str, str]):
        self.keys = tmp_path / "keys"
        self.base = {
            "AGENTMESH_LLM_PROVIDER": "openai", "AGENTMESH_LLM_BASE_URL": llm_base_url,
            "AGENTMESH_LLM_MODEL": "test-model", "AGENTMESH_LLM_API_KEY": "sk-test-secret-key-0123456789",
            "AGENTMESH_DRAIN_S": "1", "AGENTMESH_TRACES": "none", "AGENTMESH_GATEWAY_HTTP_ADDR": "127.0.0.1:0",
            "AGENTMESH_AUTH_TOKENS": TOKEN, "AGENTMESH_SERVICE_KEYS_DIR": str(self.keys),
            "PATH": "/usr/local/bin:/usr/bin:/bin", **extra_env,
        }
        self.tmp = tmp_path
        self.addresses = dict.fromkeys(("gateway", "agent", "tools", "memory", "scheduler"), "127.0.0.1:0")
        self.hosts = []
        self.channels = []

    def settings(self, home: str, **addresses: str) -> Settings:
        base = Settings.from_env({**self.base, "AGENTMESH_HOME": str(self.tmp / home)})
        return dataclasses.replace(base, addresses={**self.addresses, **addresses})

    async def start(self, name: str, home: str, **addresses: str):
        host = await start_service(name, self.settings(home, **addresses), "127.0.0.1:0")
        self.hosts.append(host)
        return host.target

    async def __aenter__(self):
        self.addresses["memory"] = await self.start("memory", "memory-home")
        self.tools_a = await self.start("tools", "tools-a-home")
        self.tools_b = await self.start("tools", "tools-b-home")
        self.addresses["agent"] = await self.start("agent", "agent-home", tools=self.tools_b)
        self.addresses["gateway"] = await self.start("gateway", "gateway-home", tools=self.tools_a)
        return self

    async def __aexit__(self, *exc):
        for channel in self.channels:
            await channel.close()
        for host in reversed(self.hosts):
            await host.stop(grace=1)
            host.telemetry.shutdown()

    def stub(self, service: str, address: str, caller: str = ""):
        channel = signed_channel(self.keys, caller, service, address) if caller else caller_channel(self.keys, service, address)
        self.channels.append(channel)
        return channel


async def test_a_server_added_through_one_replica_is_called_through_the_other_and_removed_from_both(tmp_path, llm, calc):
    env = {"AGENTMESH_TOOLS_WEB_ALLOW": f"127.0.0.1:{calc.port}"}
    async with TwoToolsReplicas(tmp_path, llm.base_url, env) as stack:
        gateway = gateway_pb2_grpc.GatewayStub(stack.stub("gateway", stack.addresses["gateway"]))
        replica_b = tools_service_pb2_grpc.ToolsStub(stack.stub("tools", stack.tools_b))
        before = await replica_b.ListTools(tools_pb2.ListToolsRequest(namespace="team-a"))
        assert "calc__add" not in {t.name for t in before.tools}

        # Added through the gateway, which reaches replica A ...
        status = await gateway.AddMcpServer(tools_pb2.AddMcpServerRequest(
            namespace="team-a", server=tools_pb2.McpServerSpec(name="calc", url=calc.url)), metadata=AUTH, timeout=90)
        assert status.available and "calc__add" in status.tools

        # ... and the next turn, whose agent reaches replica B only, is offered the tool and calls it.
        await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id="a1", namespace="team-a"), metadata=AUTH)
        llm.add(reply("", tool_call("calc__add", {"a": 2, "b": 3}, id="c1")), reply("5."))
        events = await collect(gateway.Chat(gateway_pb2.ChatRequest(session_id="a1", message="add"), metadata=AUTH, timeout=60))
        result = of_kind(events, "tool_result")[0].result
        assert not result.is_error, result.output
        assert dict(result.data["structured_content"]) == {"sum": 5}
        assert "calc__add" in {t["function"]["name"] for t in llm.requests[0].body["tools"]}
        # B runs the server on its own: nothing of it is on A's disk or in B's home but its registration.
        assert not (tmp_path / "tools-b-home" / "mcp" / "namespaces" / "team-a.json").exists()

        # Removed through A: gone from A's catalog, and B's next turn no longer has it.
        await gateway.RemoveMcpServer(tools_pb2.RemoveMcpServerRequest(namespace="team-a", name="calc"), metadata=AUTH)
        listed = await gateway.ListTools(tools_pb2.ListToolsRequest(namespace="team-a"), metadata=AUTH)
        assert "calc__add" not in {t.name for t in listed.tools}
        llm.add(reply("", tool_call("calc__add", {"a": 2, "b": 3}, id="c2")), reply("gone."))
        events = await collect(gateway.Chat(gateway_pb2.ChatRequest(session_id="a1", message="again"), metadata=AUTH, timeout=60))
        assert "calc__add" not in {t["function"]["name"] for t in llm.requests[2].body["tools"]}
        assert of_kind(events, "tool_result")[0].result.is_error
        as_gateway = tools_service_pb2_grpc.ToolsStub(stack.stub("tools", stack.tools_b, caller="gateway"))
        assert not (await as_gateway.ListMcpServers(tools_pb2.ListMcpServersRequest(namespace="team-a"))).servers


async def test_a_replica_that_has_the_turns_version_asks_the_memory_service_nothing(tmp_path, llm, calc):
    """The version is the signal: a replica that has read the version a call carries answers from
    what it holds, without reading the registrations; a newer version makes it read them."""
    env = {"AGENTMESH_TOOLS_WEB_ALLOW": f"127.0.0.1:{calc.port}"}
    async with TwoToolsReplicas(tmp_path, llm.base_url, env) as stack:
        replica_a = tools_service_pb2_grpc.ToolsStub(stack.stub("tools", stack.tools_a, caller="gateway"))
        replica_b = tools_service_pb2_grpc.ToolsStub(stack.stub("tools", stack.tools_b))
        await replica_a.AddMcpServer(tools_pb2.AddMcpServerRequest(
            namespace="team-a", server=tools_pb2.McpServerSpec(name="calc", url=calc.url)), timeout=90)
        as_gateway = memory_service_pb2_grpc.MemoryStub(stack.stub("memory", stack.addresses["memory"], caller="gateway"))
        settings = sessions_pb2.GetNamespaceSettingsRequest(namespace="team-a")
        added = (await as_gateway.GetNamespaceSettings(settings)).mcp_servers_version
        assert added > 0

        def add(a, b, version):
            return replica_b.Execute(tools_service_pb2.ExecuteRequest(
                session_id="s1", call_id="c1", name="calc__add", arguments_json=json.dumps({"a": a, "b": b}),
                namespace="team-a", mcp_servers_version=version), timeout=60)

        assert dict((await add(1, 2, added)).result.data["structured_content"]) == {"sum": 3}

        # The registration goes behind B's back (as A's RemoveMcpServer does): the version moves.
        as_tools = memory_service_pb2_grpc.MemoryStub(stack.stub("memory", stack.addresses["memory"], caller="tools"))
        await as_tools.RemoveMcpRegistration(memory_service_pb2.RemoveMcpRegistrationRequest(namespace="team-a", name="calc"))
        removed = (await as_gateway.GetNamespaceSettings(settings)).mcp_servers_version
        assert removed > added

        # A call still carrying the version B has read is answered from what B holds: no read.
        assert dict((await add(2, 2, added)).result.data["structured_content"]) == {"sum": 4}
        # The newer version makes B read the registrations: the server is gone.
        gone = await add(2, 3, removed)
        assert gone.result.is_error and gone.result.error_kind == "unknown_tool"
        # A namespace that never had a server (version 0) is not asked about at all.
        empty = await replica_b.ListTools(tools_pb2.ListToolsRequest(namespace="team-z", mcp_servers_version=0))
        assert "calc__add" not in {t.name for t in empty.tools}
