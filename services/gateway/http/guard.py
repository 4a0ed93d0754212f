"""What the gateway's HTTP server does about slow and greedy clients, below aiohttp.

aiohttp closes a connection that sits idle between requests (its keep-alive timeout), but gives
a request's head and body as long as the client likes: a client sending one byte every few
seconds held a connection (and its buffers and file descriptor) for as long as it liked, and
nothing bounded how many one address held. Here, per connection:

- the request head (request line and headers) must be complete `header_timeout_s` after the
  connection opened or, on a kept-alive connection, after the head's first byte: otherwise a
  408 answer and the connection closed. No credentials are needed to send a head, so this
  holds before anything else;
- at most `max_per_ip` connections from one client address at once (0: no cap): the next one
  is answered 429 and closed before a byte of it is read;
- the body is the middleware's (`read_body`): it must arrive whole in `body_timeout_s`.

`ConnectionGuard` wraps the protocol aiohttp makes for each connection and passes everything on,
looking only for the blank line that ends a head. The middleware tells it when a request has
been answered (`request_done`), so the next head's clock starts at its first byte.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from typing import Any, Callable

from aiohttp import web

from agentmesh.errors import InvalidArgument, PermissionDenied
from agentmesh.gateway.http.errors import error_body

__all__ = ["BodyTooSlow", "ClientLimits", "ConnectionGuard", "HttpLimits", "check_host", "read_body"]

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
# host[:port], the host a name or an address ([v6] in brackets): what a Host header may be.
_HOST = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(?::(?P<port>[0-9]{1,5}))?$")


@dataclass(frozen=True)
class HttpLimits:
    """The HTTP server's bounds on its clients (GatewaySettings: AGENTMESH_GATEWAY_HTTP_*)."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    idle_timeout_s: float = 30.0
    max_per_ip: int = 256


def _raw_answer(status: int, reason: str, code: str, message: str) -> bytes:
    body = json.dumps(error_body(code, message)).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode() + body


class ClientLimits:
    """The open connections of each client address, and the guard of each connection."""

    def __init__(self, limits: HttpLimits):
        self.limits = limits
        self.open: dict[str, int] = {}
        self.guards: dict[Any, ConnectionGuard] = {}  # transport -> its guard
        self.too_many = _raw_answer(
            429, "Too Many Requests", "RESOURCE_EXHAUSTED",
            f"this address has {limits.max_per_ip} connections open to the gateway, the most one client may "
            "(AGENTMESH_GATEWAY_HTTP_MAX_CONNECTIONS_PER_IP); close some, or reuse them")
        self.slow = _raw_answer(
            408, "Request Timeout", "DEADLINE_EXCEEDED",
            f"the request's headers did not arrive within {limits.header_timeout_s:g}s "
            "(AGENTMESH_GATEWAY_HTTP_HEADER_TIMEOUT_S); the connection is closed")

    def factory(self, make: Callable[[], Any]) -> Callable[[], asyncio.Protocol]:
        """A protocol factory for `loop.create_server`: aiohttp's protocol, guarded."""
        return lambda: ConnectionGuard(make(), self)

    def request_done(self, transport: Any) -> None:
        guard = self.guards.get(transport)
        if guard is not None:
            guard.request_done()

    def __len__(self) -> int:
        return len(self.guards)


class ConnectionGuard(asyncio.Protocol):
    __slots__ = ("_clients", "_head_seen", "_inner", "_ip", "_tail", "_timer", "_transport")

    def __init__(self, inner: Any, clients: ClientLimits):
        self._inner = inner
        self._clients = clients
        self._ip: str | None = None  # counted against this address (None: refused, or not yet)
        self._transport: Any = None
        self._timer: asyncio.TimerHandle | None = None
        self._head_seen = False  # the current request's head is complete
        self._tail = b""  # the last bytes seen, for a blank line split across reads

    def connection_made(self, transport: Any) -> None:
        self._transport = transport
        peer = transport.get_extra_info("peername")
        ip = str(peer[0]) if peer else ""
        cap = self._clients.limits.max_per_ip
        if cap and self._clients.open.get(ip, 0) >= cap:
            transport.write(self._clients.too_many)
            transport.close()  # aiohttp never sees it
            return
        self._ip = ip
        self._clients.open[ip] = self._clients.open.get(ip, 0) + 1
        self._clients.guards[transport] = self
        self._arm()  # the first head's clock starts with the connection
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._ip is None:
            return
        if not self._head_seen:
            if self._timer is None:
                self._arm()  # a kept-alive connection's next request: its first byte
            seen = self._tail + data
            # A head ends with a blank line: CRLF CRLF, or a bare LF LF, which parsers accept too.
            if b"\n\r\n" in seen or b"\n\n" in seen:
                self._head_seen = True
                self._disarm()
                self._tail = b""
            else:
                self._tail = seen[-2:]
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._ip is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._ip is None:
            return
        self._disarm()
        self._clients.guards.pop(self._transport, None)
        left = self._clients.open.get(self._ip, 1) - 1
        if left > 0:
            self._clients.open[self._ip] = left
        else:
            self._clients.open.pop(self._ip, None)
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._ip is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._ip is not None:
            self._inner.resume_writing()

    def request_done(self) -> None:
        """The request was answered: the next head's clock starts at its first byte (until then
        the connection is idle, aiohttp's keep-alive timeout's to close)."""
        self._head_seen = False
        self._tail = b""
        self._disarm()

    def _arm(self) -> None:
        self._disarm()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._clients.limits.header_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _too_slow(self) -> None:
        self._timer = None
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        transport.write(self._clients.slow)
        transport.close()


class BodyTooSlow(Exception):
    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


async def read_body(request: web.Request, timeout_s: float) -> bytes:
    """The whole body (aiohttp keeps it for the handler's own `read()`); BodyTooSlow when it has
    not arrived in `timeout_s`."""
    try:
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except TimeoutError:
        raise BodyTooSlow(
            f"the request body did not arrive within {timeout_s:g}s (AGENTMESH_GATEWAY_HTTP_BODY_TIMEOUT_S); "
            "the connection is closed") from None


def check_host(request: web.Request, bound: str) -> None:
    """The Host header, strictly: exactly one, `host[:port]` with a port of 1-65535; and on a
    loopback address (`bound`), a loopback name — so a web page elsewhere cannot reach the local
    API through DNS rebinding (a name of its own resolving to 127.0.0.1)."""
    values = request.headers.getall("Host", [])
    if len(values) != 1:
        raise InvalidArgument(f"send exactly one Host header (got {len(values)})")
    match = _HOST.match(values[0])
    port = match.group("port") if match else None
    if match is None or (port is not None and not 0 < int(port) <= 65535):
        raise InvalidArgument(f"the Host header {values[0][:100]!r} is not host[:port]")
    if bound not in ("127.0.0.1", "localhost", "::1"):
        return
    if match.group("host").lower() not in LOOPBACK_HOSTS:
        raise PermissionDenied(
            f"this gateway listens on {bound} and answers only requests addressed to a loopback host "
            "(127.0.0.1, localhost, [::1]); set AGENTMESH_GATEWAY_HTTP_ADDR to serve other names")
