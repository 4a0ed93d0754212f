"""The egress policy: which addresses an outgoing HTTP request of the platform may reach.

Server-side request forgery is the risk — a model (web_fetch), a namespace's MCP server or a
webhook URL pointing at the cloud metadata service or a database on the cluster network. Every
connection goes through `GuardedBackend`, which resolves the host itself, refuses when any
resolved address is not globally routable (loopback, link-local, private, shared, reserved,
multicast) unless configured, and then connects to the address it checked — so a DNS answer that
changes between check and connect (rebinding) cannot slip through. Shared by the tools service
(web_fetch, remote MCP and A2A servers) and the gateway (run webhooks), so both refuse alike.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from dataclasses import dataclass
from typing import Any, Iterable

import httpcore
import httpx

from agentmesh.config import ConfigError

__all__ = ["AddressPolicy", "AddressRefused", "GuardedBackend", "check_url", "guarded_transport"]


class AddressRefused(httpcore.ConnectError):
    """Raised from the network backend; httpx turns it into a ConnectError we recognise."""


@dataclass(frozen=True)
class AddressPolicy:
    allow_private: bool = False
    # Specific non-public endpoints that are still allowed: (network, port or None for any port).
    allowed: tuple[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, int | None], ...] = ()

    @classmethod
    def parse(cls, allow_private: bool, entries: Iterable[str]) -> "AddressPolicy":
        allowed = []
        for raw in entries:
            entry = raw.strip()
            if not entry:
                continue
            host, port = entry, None
            try:
                if "/" not in entry and entry.count(":") == 1:
                    host, _, port_text = entry.partition(":")
                    port = int(port_text)
                allowed.append((ipaddress.ip_network(host, strict=False), port))
            except ValueError:
                raise ConfigError(
                    f"AGENTMESH_TOOLS_WEB_ALLOW entry {entry!r} is not an address, address:port or network (CIDR)"
                ) from None
        return cls(allow_private, tuple(allowed))

    def permits(self, address: str, port: int) -> bool:
        ip = ipaddress.ip_address(address.split("%")[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
            ip = ip.ipv4_mapped
        if ip.is_global and not ip.is_multicast:
            return True
        if self.allow_private:
            return True
        return any(ip in network and (allowed_port is None or allowed_port == port) for network, allowed_port in self.allowed)


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """Resolves, checks and connects in one step, so the address checked is the address used."""

    def __init__(self, policy: AddressPolicy, who: str = "web_fetch"):
        self._policy = policy
        self._who = who
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc.strerror}") from None
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        refused = [a for a in addresses if not self._policy.permits(a, port)]
        if refused or not addresses:
            raise AddressRefused(
                f"{host} resolves to {', '.join(refused) or 'nothing'}, which is not a public internet address; "
                f"{self._who} does not reach loopback, link-local or private networks"
            )
        return await self._inner.connect_tcp(addresses[0], port, timeout, local_address, socket_options)

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[Any] | None = None) -> httpcore.AsyncNetworkStream:
        raise AddressRefused(f"unix sockets are not reachable from {self._who}")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def guarded_transport(policy: AddressPolicy, ssl_context: ssl.SSLContext, who: str = "web_fetch") -> httpx.AsyncHTTPTransport:
    transport = httpx.AsyncHTTPTransport(verify=ssl_context, trust_env=False)
    # httpx has no public hook for the network backend; the pool it builds is swapped for an
    # identical one that connects through the guard.
    transport._pool = httpcore.AsyncConnectionPool(  # noqa: SLF001 - see above
        ssl_context=ssl_context,
        network_backend=GuardedBackend(policy, who),
        max_connections=10,
    )
    return transport


async def check_url(url: str, policy: AddressPolicy, who: str) -> str:
    """Why `url` cannot be reached under `policy` ('' when it can): not http(s), a host that does
    not resolve, or one that resolves to an address the policy refuses."""
    parsed = httpx.URL(url) if url.startswith(("http://", "https://")) else None
    if parsed is None or not parsed.host:
        return f"{url[:200]!r} is not an http:// or https:// URL"
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(parsed.host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return f"the host {parsed.host!r} does not resolve ({exc.strerror})"
    refused = [a for a in dict.fromkeys(str(info[4][0]) for info in infos) if not policy.permits(a, port)]
    if refused:
        return (f"{parsed.host} resolves to {', '.join(refused)}, which is not a public internet address; "
                f"{who} does not reach loopback, link-local or private networks")
    return ""
