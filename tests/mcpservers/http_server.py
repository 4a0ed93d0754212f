"""A streamable-HTTP MCP server built with the `mcp` SDK (MCPServer), served by uvicorn on a
port of its own in a background thread."""

from __future__ import annotations

import base64
import socket
import threading
import time

import anyio
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ImageContent, TextContent
from pydantic import BaseModel

# A 1x1 PNG.
PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)


class Sum(BaseModel):
    sum: int


def build_server(events: list[str]) -> MCPServer:
    server = MCPServer("calc")

    @server.tool(description="Add two integers.")
    def add(a: int, b: int) -> Sum:
        return Sum(sum=a + b)

    @server.tool(description="A tiny picture.")
    def picture() -> list:
        return [TextContent(type="text", text="one pixel"),
                ImageContent(type="image", data=base64.b64encode(PIXEL).decode(), mime_type="image/png")]

    @server.tool(description="Always fails.")
    def fail(reason: str) -> str:
        raise ToolError(f"failed on purpose: {reason}")

    @server.tool(description="Sleeps, then answers.")
    async def slow(seconds: float) -> str:
        try:
            await anyio.sleep(seconds)
        except anyio.get_cancelled_exc_class():
            events.append("slow cancelled")
            raise
        events.append("slow finished")
        return "woke up"

    @server.tool(description="The trace context the call carried in _meta.")
    def traceparent(ctx: Context) -> str:
        return (ctx.request_context.meta or {}).get("traceparent", "none")

    return server


def requiring_authorization(app, expected: str, seen: list[str]):
    """`app` behind a check of the Authorization header (401 unless it is `expected`); every
    value received is recorded in `seen`."""
    async def guarded(scope, receive, send):
        if scope["type"] == "http":
            value = dict(scope["headers"]).get(b"authorization", b"").decode()
            seen.append(value)
            if value != expected:
                await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]})
                await send({"type": "http.response.body", "body": b"unauthorized"})
                return
        await app(scope, receive, send)
    return guarded


class HttpMcpServer:
    def __init__(self, server: MCPServer | None = None, authorization: str = ""):
        """`server`: another MCPServer to serve instead of the calculator; `authorization`: the
        Authorization header every request must carry (the values received are in `.authorizations`)."""
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.events: list[str] = []  # what the server saw happen, for tests
        app = (server or build_server(self.events)).streamable_http_app()
        self.authorizations: list[str] = []
        if authorization:
            app = requiring_authorization(app, authorization, self.authorizations)
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> "HttpMcpServer":
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the MCP test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(5)
        self.sock.close()
