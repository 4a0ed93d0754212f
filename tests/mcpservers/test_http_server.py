"""A streamable-HTTP MCP server built with the SDK's MCPServer, reached through the egress
policy of web_fetch: its tools, their results (structured, images, errors), timeouts."""

from __future__ import annotations

import asyncio
import json
import re

from agentmesh.internal.v1 import tools_service_pb2
from agentmesh.v1 import tools_pb2
from tests.mcpservers.conftest import write_servers
from tests.mcpservers.http_server import PIXEL
from tests.support.stack import Stack
from tests.support.turns import wait_until


async def execute(stack, name: str, arguments: dict, timeout_s: float = 0.0):
    request = tools_service_pb2.ExecuteRequest(session_id="s1", call_id="c1", name=name,
                                       arguments_json=json.dumps(arguments), timeout_s=timeout_s)
    return (await stack.tools_stub().Execute(request, timeout=60)).result


def http_env(tmp_path, server, allowed: bool) -> dict:
    env = {"AGENTMESH_MCP_SERVERS": write_servers(tmp_path / "mcp.json", {"calc": {"url": server.url}})}
    if allowed:
        env["AGENTMESH_TOOLS_WEB_ALLOW"] = f"127.0.0.1:{server.port}"
    return env


async def test_http_server_tools_are_listed_and_their_results_mapped(tmp_path, http_mcp):
    async with Stack(tmp_path / "home", env=http_env(tmp_path, http_mcp, True), services=("memory", "tools")) as stack:
        listed = {t.name: t for t in (await stack.tools_stub().ListTools(tools_pb2.ListToolsRequest())).tools}
        assert {"calc__add", "calc__picture", "calc__fail", "calc__slow"} <= set(listed)
        schema = json.loads(listed["calc__add"].parameters_json_schema)
        assert schema["type"] == "object" and set(schema["required"]) == {"a", "b"}
        assert "Add two integers." in listed["calc__add"].description

        added = await execute(stack, "calc__add", {"a": 2, "b": 3})
        assert not added.is_error and "5" in added.output
        assert dict(added.data["structured_content"]) == {"sum": 5}
        assert added.data["mcp_server"] == "calc"

        # An image the model can take is shown to it: stored once in the session's workspace,
        # referenced by the result (the agent reads it into the next model request).
        picture = await execute(stack, "calc__picture", {})
        assert not picture.is_error and "one pixel" in picture.output
        assert "[image: image 1, 1×1 PNG — shown to you as an image]" in picture.output
        [image] = picture.images
        assert (image.media_type, image.width, image.height, image.data) == ("image/png", 1, 1, b"")
        stored = stack.settings.home / "workspaces" / "s1" / image.path
        assert image.path.startswith(".attachments/") and stored.read_bytes() == PIXEL
        assert "attachments" not in picture.data

        failed = await execute(stack, "calc__fail", {"reason": "because"})
        assert failed.is_error and failed.error_kind == "tool_error" and "failed on purpose: because" in failed.output

        wrong = await execute(stack, "calc__add", {"a": "two", "b": 3})
        assert wrong.is_error and wrong.error_kind == "invalid_arguments"

        # The call carries the trace context in _meta, the way MCP servers read it.
        traced = await execute(stack, "calc__traceparent", {})
        assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}", traced.output), traced.output

        slow = await execute(stack, "calc__slow", {"seconds": 5}, timeout_s=0.5)
        assert slow.is_error and slow.error_kind == "timeout", slow.output


async def test_images_over_the_cap_are_dropped_with_a_note(tmp_path, http_mcp):
    env = {**http_env(tmp_path, http_mcp, True), "AGENTMESH_MCP_ATTACHMENT_CAP_BYTES": "10"}
    async with Stack(tmp_path / "home", env=env, services=("memory", "tools")) as stack:
        picture = await execute(stack, "calc__picture", {})
        assert "attachment cap" in picture.output and "attachments" not in picture.data


async def test_an_address_the_egress_policy_refuses_leaves_the_server_unavailable(tmp_path, http_mcp):
    async with Stack(tmp_path / "home", env=http_env(tmp_path, http_mcp, False), services=("memory", "tools")) as stack:
        listed = [t.name for t in (await stack.tools_stub().ListTools(tools_pb2.ListToolsRequest())).tools]
        assert not [name for name in listed if name.startswith("calc__")]
        result = await execute(stack, "calc__add", {"a": 1, "b": 2})
        assert result.is_error and result.error_kind == "unavailable"
        assert "egress policy" in result.output and "127.0.0.1" in result.output


async def test_cancelling_the_call_cancels_the_request_on_the_server(tmp_path, http_mcp):
    async with Stack(tmp_path / "home", env=http_env(tmp_path, http_mcp, True), services=("memory", "tools")) as stack:
        request = tools_service_pb2.ExecuteRequest(session_id="s1", call_id="c1", name="calc__slow",
                                           arguments_json=json.dumps({"seconds": 3}), timeout_s=10)
        call = stack.tools_stub().Execute(request, timeout=30)
        await asyncio.sleep(0.5)
        call.cancel()
        await wait_until(lambda: http_mcp.events)
        assert http_mcp.events == ["slow cancelled"]
