"""How a connection reaches its server: a stdio server as a process in the local jail, an HTTP
server through the egress policy of web_fetch. Neither ever runs a server inside this process."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlparse

import httpx2
from mcp import StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from agentmesh.tools.mcp.config import McpServerEntry
from agentmesh.tools.mcp.connection import Opener, ServerUnavailable
from agentmesh.tools.mcp.fetch import FetchFailed, Installed, PackageFetcher
from agentmesh.tools.mcp.server_paths import server_binds
from agentmesh.tools.mcp.start_failure import explain_exit
from agentmesh.tools.sandbox.base import CommandSpec
from agentmesh.tools.sandbox.local import LocalJail
from agentmesh.tools.web_tools import AddressPolicy

# bwrap takes its options (with the server's environment: its secrets) and its seccomp filter as
# open descriptors; the SDK's spawn cannot pass any, so a shell opens them and execs the jail.
# The options are a memfd of this process, opened through /proc (no file on disk holds the
# secrets); the shell's own command line names only that and the compiled filter, and is gone
# with its exec.
OPTIONS_FD = 3
SECCOMP_FD = 4
WRAPPER = ("/bin/sh", "-c", f'exec "$@" {OPTIONS_FD}<"$0"')
SECCOMP_WRAPPER = ("/bin/sh", "-c", f'f=$1; shift; exec "$@" {OPTIONS_FD}<"$0" {SECCOMP_FD}<"$f"')
# Where an npx/uvx entry's package is installed from, and the cache it is installed into.
Packages = tuple[PackageFetcher, Path]


class JailedStdioOpener:
    """Opens a stdio server as a process in the local jail (an `Opener`), and says what the last
    process started wrote to stderr, as a sentence with the fix (`last_words`): when it ends before
    it answered, the SDK says only "Connection closed", and those lines are the reason (a
    traceback's exception, bwrap's own error). `find_binds`: bind what the command needs to run (its interpreter, its virtual
    environment: server_paths.py) besides the entry's own `mounts`."""

    def __init__(self, entry: McpServerEntry, jail: LocalJail, workdir: Path, errlog: TextIO,
                 seccomp_file: Path | None, find_binds: bool = True, packages: Packages | None = None):
        self._entry = entry
        self._jail = jail
        self._workdir = workdir
        self._errlog = errlog
        self._seccomp_file = seccomp_file
        self._find_binds = find_binds
        # An npx/uvx entry: its package installed once (fetch.py), then its program run from there.
        self._packages = packages if entry.package is not None else None
        self._command = entry.command
        self._binds = entry.mounts if self._packages is not None or not find_binds else (
            *server_binds(entry.command, jail.home), *entry.mounts)
        self._log_start = 0  # the stderr log's size when the last process started
        self._fetch_failed = False
        self._installed: Installed | None = None  # the install the running process uses (held: fetch.py)

    def last_words(self) -> str:
        """Why the process ended before it answered, with the fix (start_failure.py)."""
        if self._fetch_failed:
            return ""  # no process ran: the fetch's own sentence stands
        return explain_exit(self._command, stderr_lines(self._errlog, self._log_start), self._binds,
                            namespace=not self._find_binds, private=str(self._jail.home or ""))

    async def _program(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The argv to run and the host paths to bind for it."""
        entry = self._entry
        if self._packages is None or entry.package is None:
            return (entry.command, *entry.args), self._binds
        fetcher, cache = self._packages
        self._fetch_failed = False
        try:
            installed = await fetcher.ensure(entry, entry.package, cache)
        except FetchFailed as exc:
            self._fetch_failed = True
            raise ServerUnavailable(str(exc)) from None
        self._installed = installed
        self._command = installed.command
        self._binds = (installed.directory, *entry.mounts)
        return (installed.command, *entry.package.args), self._binds

    @asynccontextmanager
    async def __call__(self) -> AsyncIterator[tuple[Any, Any]]:
        program, binds = await self._program()
        try:
            async with self._run(program, binds) as streams:
                yield streams
        finally:
            # The process has ended: its install may be pruned from the cache again.
            if self._packages is not None and self._installed is not None:
                self._packages[0].release(self._installed)
                self._installed = None

    @asynccontextmanager
    async def _run(self, program: tuple[str, ...], binds: tuple[str, ...]) -> AsyncIterator[tuple[Any, Any]]:
        entry = self._entry
        spec = CommandSpec(
            session_id=f"mcp-{entry.name}", call_id="", argv=program, timeout_s=0,
            # No TRACEPARENT: one long-lived process serves many traces; each call's _meta carries its own.
            network=entry.network,
        )
        command = self._jail.jail_argv(self._workdir, spec, seccomp_fd=SECCOMP_FD if self._seccomp_file else None,
                                       extra_env={**(fetcher_env(entry.command, entry.network) if self._packages is None else {}),
                                                  **entry.env},
                                       ro_binds=binds, options_fd=OPTIONS_FD)
        options = os.memfd_create(f"mcp-{entry.name}-options", os.MFD_CLOEXEC)
        try:
            command.write_options(options)
            source = f"/proc/{os.getpid()}/fd/{options}"
            if self._seccomp_file is not None:
                argv = [*SECCOMP_WRAPPER, source, str(self._seccomp_file), *command.argv]
            else:
                argv = [*WRAPPER, source, *command.argv]
            parameters = StdioServerParameters(command=argv[0], args=argv[1:], cwd=str(self._workdir))
            self._errlog.flush()
            self._log_start = os.fstat(self._errlog.fileno()).st_size
            async with stdio_client(parameters, errlog=self._errlog) as streams:
                yield streams
        finally:
            os.close(options)


# npx keeps what it fetched in $HOME/.npm, the server's own /workspace (kept across restarts); told
# to prefer that cache it does not ask the registry at every start, and without network (no
# retries: see fetcher_env) it starts from the cache at once. No update notice on its stderr.
NPX_ENV = {"npm_config_prefer_offline": "true", "npm_config_update_notifier": "false"}


def fetcher_env(command: str, network: bool) -> dict[str, str]:
    """The environment a package runner needs to run from its cache (an entry's own `env` wins).
    Without network a fetch cannot succeed: npm's retries (a minute of backoff) would only
    outlast the connect timeout and hide npm's reason."""
    if os.path.basename(command) != "npx":
        return {}
    return dict(NPX_ENV) if network else {**NPX_ENV, "npm_config_fetch_retries": "0"}


def stderr_lines(errlog: TextIO, start: int) -> list[str]:
    """The non-empty lines the server wrote to stderr since `start` (its log's size when it was
    started), of its last 64 KiB."""
    try:
        errlog.flush()
        with open(errlog.name, "rb") as log:  # the log is opened for appending only
            log.seek(max(start, os.fstat(log.fileno()).st_size - 64 * 1024))
            tail = log.read(64 * 1024).decode("utf-8", errors="replace")
    except OSError:
        return []
    return [line.strip() for line in tail.splitlines() if line.strip()]


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
