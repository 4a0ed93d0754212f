"""The MCP provider of the catalog: each connected server's tools as `<server>__<tool>`, with the
server's own JSON schema (checked like every built-in tool's before a call is sent)."""

from __future__ import annotations

import asyncio
import re
from typing import Any, Callable

import jsonschema
import mcp.types as mcp_types
from mcp.shared.exceptions import MCPError
from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT
from opentelemetry import trace

from agentmesh.config import ConfigError
from agentmesh.logs import get_logger
from agentmesh.tools.catalog import CallContext, Tool, ToolFunc, ToolSpec
from agentmesh.tools.mcp.connection import McpServerConnection, ServerUnavailable, describe
from agentmesh.tools.mcp.results import to_outcome
from agentmesh.tools.results import ToolOutcome
from agentmesh.tools.settings import SandboxLimits

log = get_logger("agentmesh.tools.mcp")

SEPARATOR = "__"
MAX_TOOL_NAME = 64  # the model APIs' limit
UNSAFE_CHARS = re.compile(r"[^A-Za-z0-9_-]")


def catalog_name(server: str, tool: str) -> str:
    return (server + SEPARATOR + UNSAFE_CHARS.sub("_", tool))[:MAX_TOOL_NAME]


class UnusableSchema(ValueError):
    pass


def check_schema(server: str, tool: mcp_types.Tool) -> dict[str, Any]:
    schema = tool.input_schema
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise UnusableSchema(f"MCP server {server!r}: tool {tool.name!r} has an input schema whose root is not "
                             "an object, which model tool calls cannot fill")
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise UnusableSchema(f"MCP server {server!r}: tool {tool.name!r} has an invalid input schema: {exc.message}") from None
    return schema


class McpTools:
    """ToolProvider over every configured server; its catalog follows the servers' listings."""

    dynamic = True

    def __init__(self, connections: list[McpServerConnection], limits: SandboxLimits, image_cap_bytes: int,
                 tracer: trace.Tracer | None = None):
        self._connections = {c.name: c for c in connections}
        self._limits = limits
        self._image_cap = image_cap_bytes
        self._tracer = tracer or trace.get_tracer("agentmesh.tools.mcp")
        self._tools: dict[str, Tool] = {}
        # Told when the catalog changes (the tools service's catalog version, catalog_version.py).
        self.on_change: Callable[[], None] = lambda: None
        for connection in connections:
            connection.on_tools_changed = self._rebuild

    async def start(self) -> None:
        """Connect to every server. A server that is down is logged and shown unavailable; a tool
        schema the model cannot use is a ConfigError (the operator must fix the server or drop it)."""
        await asyncio.gather(*(c.start() for c in self._connections.values()))
        for connection in self._connections.values():
            for tool in connection.tools:
                try:
                    check_schema(connection.name, tool)
                except UnusableSchema as exc:
                    raise ConfigError(str(exc)) from None
            if connection.error:
                log.warning("MCP server unavailable at start", server=connection.name, error=connection.error)

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self._connections.values()))

    def names(self) -> set[str]:
        return set(self._connections)

    def add(self, connection: McpServerConnection) -> None:
        """One more (started) server; its tools join the catalog."""
        self._connections[connection.name] = connection
        connection.on_tools_changed = self._rebuild
        self._rebuild()

    async def remove(self, name: str) -> bool:
        connection = self._connections.pop(name, None)
        if connection is None:
            return False
        self._rebuild()
        await connection.close()
        return True

    def status(self) -> dict[str, dict[str, Any]]:
        return {name: {"available": c.available, "error": c.error, "tools": [t.name for t in c.tools]}
                for name, c in self._connections.items()}

    def tools(self) -> list[Tool]:
        return list(self._tools.values())

    def find(self, name: str) -> Tool | None:
        tool = self._tools.get(name)
        if tool is None and SEPARATOR in name:
            server = name.split(SEPARATOR, 1)[0]
            connection = self._connections.get(server)
            if connection is not None and not connection.tools:
                return self._unavailable_tool(name, connection)
        return tool

    def _rebuild(self) -> None:
        tools: dict[str, Tool] = {}
        for connection in self._connections.values():
            for remote in connection.tools:
                try:
                    schema = check_schema(connection.name, remote)
                except UnusableSchema as exc:
                    log.warning("MCP tool left out of the catalog", server=connection.name, tool=remote.name, error=str(exc))
                    continue
                name = catalog_name(connection.name, remote.name)
                description = remote.description or remote.title or remote.name
                # The server's own hint: a tool it marks read-only is never held in "normal" mode.
                read_only = bool(remote.annotations is not None and remote.annotations.read_only_hint)
                spec = ToolSpec(name=name, description=f"[MCP server {connection.name}] {description}", parameters=schema,
                                read_only=read_only)
                tools[name] = Tool(spec, self._runner(connection, remote.name))
        changed = {n: t.spec for n, t in tools.items()} != {n: t.spec for n, t in self._tools.items()}
        self._tools = tools
        if changed:  # a reconnect that lists the same tools changes nothing
            self.on_change()

    def _unavailable_tool(self, name: str, connection: McpServerConnection) -> Tool:
        async def unavailable(ctx: CallContext, arguments: dict[str, Any]) -> ToolOutcome:
            return ToolOutcome(output=f"MCP server {connection.name!r} is unavailable: {connection.error}",
                               is_error=True, error_kind="unavailable")
        return Tool(ToolSpec(name=name, description="", parameters={"type": "object"}), unavailable)

    def _runner(self, connection: McpServerConnection, remote_name: str) -> ToolFunc:
        async def run(ctx: CallContext, arguments: dict[str, Any]) -> ToolOutcome:
            limit = self._limits.max_timeout_s
            timeout_s = min(ctx.caller_timeout_s or self._limits.default_timeout_s, limit)
            with self._tracer.start_as_current_span(
                f"mcp.call_tool {connection.name}",
                attributes={"agentmesh.mcp.server": connection.name, "gen_ai.tool.name": remote_name,
                            "gen_ai.tool.call.id": ctx.call_id},
            ) as span:
                try:
                    # The SDK puts the current trace context (this span's) in the request's _meta.
                    result = await connection.call(remote_name, arguments, timeout_s)
                except ServerUnavailable as exc:
                    span.set_attribute("error.type", "unavailable")
                    return ToolOutcome(output=str(exc), is_error=True, error_kind="unavailable")
                except MCPError as exc:
                    if exc.error.code == CONNECTION_CLOSED:
                        connection.lost()
                        kind, text = "unavailable", (f"MCP server {connection.name!r} stopped during the call; it is "
                                                     "being restarted, and the call may be tried again")
                    elif exc.error.code == REQUEST_TIMEOUT:
                        kind, text = "timeout", f"{remote_name} on MCP server {connection.name!r} did not answer within {timeout_s:g} s"
                    else:
                        kind, text = "mcp_error", f"MCP server {connection.name!r} refused the call: {exc}"
                    span.set_attribute("error.type", kind)
                    return ToolOutcome(output=text, is_error=True, error_kind=kind)
                except TimeoutError:
                    return ToolOutcome(output=f"{remote_name} on MCP server {connection.name!r} did not answer within {timeout_s:g} s",
                                       is_error=True, error_kind="timeout")
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - the connection broke mid-call
                    return ToolOutcome(output=f"MCP server {connection.name!r} failed during the call: {describe(exc)}",
                                       is_error=True, error_kind="unavailable")
                outcome = to_outcome(result, self._image_cap)
                outcome.data.setdefault("mcp_server", connection.name)
                return outcome

        return run
