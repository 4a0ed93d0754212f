"""`notifications/tools/list_changed` is picked up: a streamable-HTTP server built with the SDK
adds a tool while it runs and says so; the tools service lists it without a restart."""

from __future__ import annotations

import json

from mcp.server.mcpserver import Context, MCPServer

from agentmesh.internal.v1 import tools_service_pb2
from agentmesh.v1 import tools_pb2
from tests.mcpservers.conftest import write_servers
from tests.mcpservers.http_server import HttpMcpServer
from tests.support.stack import Stack
from tests.support.timing import polling


def growing_server() -> MCPServer:
    server = MCPServer("grower")

    def late(word: str) -> str:
        return f"late: {word}"

    @server.tool(description="Adds the tool `late`, then tells the client its tool list changed.")
    async def grow(ctx: Context) -> str:
        server.add_tool(late, description="A tool that was not there at first.")
        # The connection speaks protocol 2025-11-25, where the change is this notification
        # (2026-07-28 sends it only to subscriptions/listen streams, ctx.notify_tools_changed).
        await ctx.session.send_tool_list_changed()
        return "grown"

    return server


async def test_a_changed_tool_list_is_listed_again(tmp_path):
    with HttpMcpServer(growing_server()) as grower:
        env = {"AGENTMESH_MCP_SERVERS": write_servers(tmp_path / "mcp.json", {"grower": {"url": grower.url}}),
               "AGENTMESH_TOOLS_WEB_ALLOW": f"127.0.0.1:{grower.port}"}
        async with Stack(tmp_path / "home", env=env, services=("memory", "tools")) as stack:
            tools = stack.tools_stub()

            async def names() -> set[str]:
                return {t.name for t in (await tools.ListTools(tools_pb2.ListToolsRequest())).tools}

            assert "grower__grow" in await names() and "grower__late" not in await names()
            grown = await tools.Execute(tools_service_pb2.ExecuteRequest(session_id="s1", call_id="c1", name="grower__grow",
                                                                 arguments_json="{}"), timeout=60)
            assert not grown.result.is_error and "grown" in grown.result.output

            async for _ in polling(0.1):  # the notification is handled by the connection's watch loop
                if "grower__late" in await names():
                    break
            assert "grower__late" in await names()
            called = await tools.Execute(tools_service_pb2.ExecuteRequest(session_id="s1", call_id="c2", name="grower__late",
                                                                  arguments_json=json.dumps({"word": "hi"})), timeout=60)
            assert not called.result.is_error and "late: hi" in called.result.output
