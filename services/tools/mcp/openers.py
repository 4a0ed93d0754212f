"""How a connection reaches its server: a stdio server as a process in the local jail, an HTTP
server through the egress policy of web_fetch. Neither ever runs a server inside this process."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlparse

import httpx2
from mcp import StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from agentmesh.tools.mcp.config import McpServerEntry
from agentmesh.tools.mcp.connection import Opener, ServerUnavailable
from agentmesh.tools.sandbox.base import CommandSpec
from agentmesh.tools.sandbox.local import LocalJail
from agentmesh.tools.web_tools import AddressPolicy

# bwrap takes its seccomp filter as an open descriptor; the SDK's spawn cannot pass one, so a
# shell opens the compiled filter on fd 3 and execs the jail.
SECCOMP_FD = 3
SECCOMP_WRAPPER = ("/bin/sh", "-c", f'exec "$@" {SECCOMP_FD}<"$0"')


def jailed_stdio_opener(entry: McpServerEntry, jail: LocalJail, workdir: Path, errlog: TextIO,
                        seccomp_file: Path | None) -> Opener:
    def open_jailed() -> AbstractAsyncContextManager[tuple[Any, Any]]:
        spec = CommandSpec(
            session_id=f"mcp-{entry.name}", call_id="", argv=(entry.command, *entry.args), timeout_s=0,
            # No TRACEPARENT: one long-lived process serves many traces; each call's _meta carries its own.
            network=entry.network,
        )
        argv = jail.jail_argv(workdir, spec, seccomp_fd=SECCOMP_FD if seccomp_file else None,
                              extra_env=entry.env, ro_binds=entry.mounts)
        if seccomp_file is not None:
            argv = [*SECCOMP_WRAPPER, str(seccomp_file), *argv]
        return stdio_client(StdioServerParameters(command=argv[0], args=argv[1:], cwd=str(workdir)), errlog=errlog)

    return open_jailed


async def check_egress(url: str, policy: AddressPolicy) -> None:
    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(parsed.hostname, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ServerUnavailable(f"cannot resolve {parsed.hostname}: {exc.strerror}") from None
    addresses = {str(info[4][0]) for info in infos}
    refused = sorted(a for a in addresses if not policy.permits(a, port))
    if refused:
        raise ServerUnavailable(
            f"{parsed.hostname} resolves to {', '.join(refused)}, which the egress policy refuses "
            "(loopback, link-local and private networks need AGENTMESH_TOOLS_WEB_ALLOW or AGENTMESH_TOOLS_WEB_ALLOW_PRIVATE)"
        )


def http_opener(entry: McpServerEntry, policy: AddressPolicy, timeout_s: float) -> Opener:
    @asynccontextmanager
    async def open_http() -> AsyncIterator[tuple[Any, Any]]:
        await check_egress(entry.url, policy)
        # No environment proxies: a proxy would connect on our behalf, past the policy.
        client = httpx2.AsyncClient(headers=dict(entry.headers), trust_env=False,
                                    timeout=httpx2.Timeout(timeout_s, read=300.0))
        async with client, streamable_http_client(entry.url, http_client=client) as streams:
            yield streams

    return open_http


def server_workdir(root: Path, name: str, owner: tuple[int, int] | None) -> Path:
    """The server's /workspace: its own directory, writable by the jail's host user."""
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o711)
    workdir = root / name
    workdir.mkdir(exist_ok=True)
    if owner is not None:
        os.chown(workdir, *owner)
    os.chmod(workdir, 0o700)
    return workdir
