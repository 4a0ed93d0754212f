"""Serve an ASGI application from an aiohttp handler.

The A2A server (a2a-sdk) and the MCP server (the `mcp` SDK) are Starlette applications. The
gateway's HTTP server is aiohttp (http/server.py says why), so they are called through ASGI from
the aiohttp handlers that own their paths — on the same address, behind the same middleware
(host check, security headers) and the same bearer-token check.

Why not the `aiohttp-asgi` package: once the request body has been read, its `receive()` answers
at once with another empty body instead of waiting for the client to go away. sse-starlette (which
both SDKs stream with) loops on `receive()` until it sees `http.disconnect`, so with that bridge it
never yields to the event loop and the whole gateway stops. Here `receive()` waits, and answers
`http.disconnect` when the response is over or the client's connection closes — what an ASGI server
does.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Awaitable, Callable, Mapping, MutableMapping

from aiohttp import web

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
AsgiApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]

# How often a waiting receive() looks whether the client's connection has closed.
_DISCONNECT_POLL_S = 0.5


async def call_asgi(app: AsgiApp, request: web.Request, *, root_path: str = "",
                    headers: Mapping[str, str] | None = None) -> web.StreamResponse:
    """Run one HTTP request through `app`; the aiohttp response it produced. `headers` are added
    to the application's own (before they are sent)."""
    bridge = _Exchange(request, dict(headers or {}))
    scope: Scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": f"{request.version.major}.{request.version.minor}",
        "method": request.method,
        "scheme": request.scheme,
        "path": request.path,
        "raw_path": request.raw_path.split("?", 1)[0].encode(),
        "root_path": root_path,
        "query_string": request.query_string.encode(),
        "headers": [(k.lower(), v) for k, v in request.raw_headers],
        "client": (request.remote or "", 0),
        "server": (request.url.host or "", request.url.port or 0),
        "state": {},
    }
    try:
        await app(scope, bridge.receive, bridge.send)
    finally:
        bridge.finished.set()
    if bridge.response is None:
        return web.Response(status=500, text="the application sent no response")
    if not bridge.ended:
        # A client gone by now (a stream it stopped reading) has nothing left to be told.
        with contextlib.suppress(ConnectionResetError):
            await bridge.response.write_eof()
    return bridge.response


class _Exchange:
    def __init__(self, request: web.Request, headers: dict[str, str]):
        self._request = request
        self._headers = headers
        self.response: web.StreamResponse | None = None
        self.ended = False
        self.finished = asyncio.Event()
        self._body_given = False

    async def receive(self) -> Message:
        if not self._body_given:
            # The whole body, at once: the server's middleware has read it already (within its
            # size and time bounds), and aiohttp keeps it.
            self._body_given = True
            return {"type": "http.request", "body": await self._request.read(), "more_body": False}
        # The body is read: what is left to say is that the client went away (or the answer is done).
        while not self.finished.is_set() and not self._client_gone():
            try:
                await asyncio.wait_for(self.finished.wait(), _DISCONNECT_POLL_S)
            except TimeoutError:
                pass
        return {"type": "http.disconnect"}

    def _client_gone(self) -> bool:
        transport = self._request.transport
        return transport is None or transport.is_closing()

    async def send(self, message: Message) -> None:
        try:
            await self._send(message)
        except ConnectionResetError:
            # The client went away. ASGI 2.3: sends after a disconnect are ignored, and the
            # application learns of it from receive().
            self.ended = True
            self.finished.set()

    async def _send(self, message: Message) -> None:
        if self.ended and self.response is not None:
            return
        kind = message["type"]
        if kind == "http.response.start":
            response = web.StreamResponse(status=message["status"])
            for name, value in message.get("headers", ()):
                response.headers.add(name.decode("latin-1"), value.decode("latin-1"))
            for name, text in self._headers.items():
                response.headers.setdefault(name, text)
            if "Content-Length" not in response.headers:
                response.enable_chunked_encoding()
            self.response = response
            await response.prepare(self._request)
        elif kind == "http.response.body":
            if self.response is None or self.ended:
                raise RuntimeError("ASGI body sent before the response started, or after it ended")
            body = message.get("body", b"")
            if body:
                await self.response.write(body)
            if not message.get("more_body", False):
                self.ended = True
                await self.response.write_eof()
                self.finished.set()
