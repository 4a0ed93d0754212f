"""Each namespace's own MCP servers (`agentmesh mcp add|list|remove`, the gateway's
AddMcpServer / ListMcpServers / RemoveMcpServer).

A server is checked before it is kept: the entry parses as a deployment entry would (a stdio
command must be found; API entries get no mounts and no network, and env only from the
namespace's secrets), an HTTP URL must be allowed by the egress policy, the server must start
and list its tools, and every tool's schema must be one a model can fill. Only then is it
registered with the memory service (registry.py), and its tools join that namespace's catalog —
and no other's.

Every tools replica serves the same servers. The memory service moves a namespace's
`mcp_servers_version` with each change; the gateway reads it with the tool policy for every turn
and the turn passes it to ListTools and Execute. A replica that has read that version already
answers from what it holds (no extra call); one that has not reads the registrations and starts
or stops servers to match. A call without a version (a person's `tools list`, an older caller)
reads them every time.

Homes of earlier versions kept the registrations in `$AGENTMESH_HOME/mcp/namespaces/<ns>.json`:
those files are registered with the memory service when the service starts (and retried until
it answers), then renamed `<ns>.json.migrated`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from opentelemetry import trace

from agentmesh.config import ConfigError
from agentmesh.errors import AgentmeshError, AlreadyExists, FailedPrecondition, InvalidArgument
from agentmesh.logs import get_logger
from agentmesh.tools.catalog import Tool
from agentmesh.tools.mcp.config import McpServerEntry, parse_entry
from agentmesh.tools.mcp.connection import McpServerConnection, ServerUnavailable
from agentmesh.tools.mcp.openers import check_egress
from agentmesh.tools.mcp.registry import Registration, Registrations
from agentmesh.tools.mcp.secrets import SecretSource, UnknownSecret
from agentmesh.tools.mcp.tools import McpTools, UnusableSchema, catalog_name, check_schema
from agentmesh.tools.settings import SandboxLimits
from agentmesh.tools.web_tools import AddressPolicy

log = get_logger("agentmesh.tools.mcp")

MAX_SERVERS_PER_NAMESPACE = 16
MAX_ARGS = 64
MAX_VALUE_CHARS = 4096
REDACTED = "(redacted)"
MIGRATION_RETRY_S = 5.0

# (entry, directory for its files, namespace) -> its supervised connection
ConnectionMaker = Callable[[McpServerEntry, Path, str], McpServerConnection]


@dataclass
class _Namespace:
    """What this replica runs for a namespace, and the version of the registrations it follows."""

    provider: McpTools
    version: float = -1.0  # -1: never read
    servers: dict[str, Registration] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # registered, but could not be started here


class NamespaceServers:
    def __init__(self, registry: Registrations, connect: ConnectionMaker, policy: AddressPolicy, limits: SandboxLimits,
                 attachment_cap_bytes: int, secrets: SecretSource, reserved: Callable[[], set[str]],
                 workdirs: Path, legacy_dir: Path | None = None, tracer: trace.Tracer | None = None,
                 sandbox: str = "local"):
        self._registry = registry
        self._sandbox = sandbox  # where stdio servers run: "local" (the jail) or "kubernetes" (pods)
        self._connect = connect
        self._policy = policy
        self._limits = limits
        self._cap = attachment_cap_bytes
        self._secrets = secrets
        self._reserved = reserved  # names of the deployment's own servers
        self._workdirs = workdirs
        self._legacy_dir = legacy_dir
        self._tracer = tracer
        self._namespaces: dict[str, _Namespace] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._legacy: set[str] = set()  # namespaces whose file is still to be registered
        self._migration: asyncio.Task[None] | None = None
        # Told when any namespace's tools change (set by the tools core: its catalog version).
        self.on_change: Callable[[], None] = lambda: None

    def _lock(self, namespace: str) -> asyncio.Lock:
        return self._locks.setdefault(namespace, asyncio.Lock())

    def _new_provider(self) -> McpTools:
        provider = McpTools([], self._limits, self._cap, self._tracer)
        provider.on_change = self._changed  # its servers' tools are part of the catalog's version
        return provider

    def _changed(self) -> None:
        self.on_change()

    # --- the catalog of a namespace ---------------------------------------------------------

    async def provider(self, namespace: str, version: float | None = None) -> McpTools | None:
        """The namespace's servers as of `version` (None: as the memory service has them now);
        None when it has none."""
        if not namespace:
            return None
        state = self._namespaces.get(namespace)
        if version is not None and namespace not in self._legacy:
            if state is None and version <= 0:
                return None  # never had a server: nothing to ask, nothing to keep
            if state is not None and version <= state.version:
                return state.provider if state.servers else None
        state = await self._sync(namespace)
        return state.provider if state is not None and state.servers else None

    async def tools(self, namespace: str, version: float | None = None) -> list[Tool]:
        provider = await self.provider(namespace, version)
        return provider.tools() if provider else []

    async def unavailable(self, namespace: str, version: float | None = None) -> dict[str, str]:
        """The namespace's servers not running on this replica, and why."""
        provider = await self.provider(namespace, version)
        state = self._namespaces.get(namespace)
        down = dict(state.errors) if state is not None else {}
        if provider is not None:
            down.update({name: s["error"] for name, s in provider.status().items() if not s["available"] and s["error"]})
        return down

    async def find(self, namespace: str, name: str, version: float | None = None) -> Tool | None:
        provider = await self.provider(namespace, version)
        return provider.find(name) if provider else None

    async def _sync(self, namespace: str) -> _Namespace | None:
        async with self._lock(namespace):
            return await self._sync_locked(namespace)

    async def _sync_locked(self, namespace: str, *, strict: bool = False) -> _Namespace | None:
        """Read the namespace's registrations and run what they say. With the memory service away
        the servers already running keep serving (logged); `strict` raises instead."""
        try:
            if namespace in self._legacy:
                await self._migrate(namespace)
            servers, version = await self._registry.list(namespace)
        except AgentmeshError as exc:
            if strict:
                raise
            log.warning("namespace MCP servers not read", namespace=namespace, error=exc.message)
            return self._namespaces.get(namespace)
        state = self._namespaces.get(namespace)
        if state is None:
            if not servers and version <= 0:
                return None  # nothing is kept for namespaces that never had a server, whatever names callers send
            state = self._namespaces[namespace] = _Namespace(self._new_provider())
        if version < state.version:
            return state  # a newer reading was applied meanwhile
        wanted = {s.name: s for s in servers}
        for name in [n for n in state.provider.names() if n not in wanted or not wanted[n].same_server(state.servers[n])]:
            await state.provider.remove(name)
        state.errors = {n: e for n, e in state.errors.items() if n in wanted}
        starting = [s for s in servers if s.name not in state.provider.names()]
        connections = await asyncio.gather(*(self._start(namespace, s, state) for s in starting))
        for connection in connections:
            if connection is not None:
                state.provider.add(connection)
        state.servers, state.version = wanted, version
        return state

    async def _start(self, namespace: str, server: Registration, state: _Namespace) -> McpServerConnection | None:
        try:
            entry = parse_entry(server.name, server.entry(), self._secrets.for_namespace(namespace), self._sandbox)
            connection = self._connect(entry, self._root(namespace), namespace)
        except ConfigError as exc:  # e.g. a secret no longer mounted on this replica
            state.errors[server.name] = str(exc)
            log.warning("namespace MCP server not started", namespace=namespace, server=server.name, error=str(exc))
            return None
        state.errors.pop(server.name, None)
        await connection.start()
        return connection

    # --- add, list, remove ------------------------------------------------------------------

    async def add(self, namespace: str, raw: dict[str, Any]) -> dict[str, Any]:
        server = _registration(raw)
        _check_sizes(server)
        entry = self._entry(namespace, server)
        async with self._lock(namespace):
            state = await self._sync_locked(namespace, strict=True)
            names = set(state.servers) if state else set()
            if server.name in self._reserved():
                raise AlreadyExists(f"MCP server {server.name!r} is one of the deployment's (AGENTMESH_MCP_SERVERS); "
                                    "choose another name")
            if server.name in names:
                raise AlreadyExists(f"namespace {namespace!r} already has an MCP server {server.name!r}; remove it first")
            if len(names) >= MAX_SERVERS_PER_NAMESPACE:
                raise FailedPrecondition(f"namespace {namespace!r} has {MAX_SERVERS_PER_NAMESPACE} MCP servers, "
                                         "the most it may have")
            if entry.url:
                try:
                    await check_egress(entry.url, self._policy)
                except ServerUnavailable as exc:
                    raise FailedPrecondition(f"MCP server {server.name!r}: {exc}") from None
            try:
                connection = self._connect(entry, self._root(namespace), namespace)
            except ConfigError as exc:
                raise FailedPrecondition(str(exc)) from None
            await connection.start()
            try:
                _check_started(server.name, connection)
                await self._registry.put(namespace, server, only_if_absent=True)
            except BaseException:
                await connection.close()
                raise
            if state is None:
                state = self._namespaces[namespace] = _Namespace(self._new_provider(), version=0.0)
            # The version is left as it was read: the next turn's (newer) one reads the
            # registrations again and so also finds what another replica changed meanwhile.
            state.servers[server.name] = server
            state.provider.add(connection)
        log.info("namespace MCP server added", namespace=namespace, server=server.name, tools=len(connection.tools))
        return _status(server, connection.available, connection.error, [t.name for t in connection.tools])

    async def list(self, namespace: str) -> list[dict[str, Any]]:
        state = await self._sync_strict(namespace)
        if state is None:
            return []
        statuses = state.provider.status()
        shown = []
        for name, server in sorted(state.servers.items()):
            status = statuses.get(name) or {"available": False, "error": state.errors.get(name, "not started"), "tools": []}
            shown.append(_status(server, status["available"], status["error"], status["tools"]))
        return shown

    async def remove(self, namespace: str, name: str) -> None:
        async with self._lock(namespace):
            if namespace in self._legacy:
                await self._migrate(namespace)
            await self._registry.remove(namespace, name)  # NotFound naming the ones there are
            state = self._namespaces.get(namespace)
            if state is not None:
                state.servers.pop(name, None)
                state.errors.pop(name, None)
                await state.provider.remove(name)
        log.info("namespace MCP server removed", namespace=namespace, server=name)

    async def _sync_strict(self, namespace: str) -> _Namespace | None:
        async with self._lock(namespace):
            return await self._sync_locked(namespace, strict=True)

    def _entry(self, namespace: str, server: Registration) -> McpServerEntry:
        try:
            return parse_entry(server.name, server.entry(), self._secrets.for_namespace(namespace), self._sandbox)
        except UnknownSecret as exc:
            raise FailedPrecondition(f"{exc}; nothing was added") from None
        except ConfigError as exc:
            raise InvalidArgument(str(exc)) from None

    async def close(self) -> None:
        if self._migration is not None:
            self._migration.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._migration
        await asyncio.gather(*(state.provider.close() for state in self._namespaces.values()))

    def _root(self, namespace: str) -> Path:
        # Stdio servers' working directories; the suffix keeps "." and ".." (valid namespaces) inside.
        return self._workdirs / f"{namespace}.servers"

    # --- the files of earlier versions --------------------------------------------------------

    def start_migration(self) -> None:
        """Register the files of an earlier version's home with the memory service, in the
        background until it answers; a namespace used before that is migrated first."""
        if self._legacy_dir is None or not self._legacy_dir.is_dir():
            return
        self._legacy = {path.name.removesuffix(".json") for path in self._legacy_dir.glob("*.json")}
        if self._legacy:
            self._migration = asyncio.create_task(self._migrate_all(), name="mcp-namespaces-migration")

    async def _migrate_all(self) -> None:
        while self._legacy:
            for namespace in sorted(self._legacy):
                try:
                    async with self._lock(namespace):
                        if namespace in self._legacy:
                            await self._migrate(namespace)
                except AgentmeshError as exc:
                    log.warning("namespace MCP servers not migrated yet", namespace=namespace, error=exc.message)
            if self._legacy:
                await asyncio.sleep(MIGRATION_RETRY_S)

    async def _migrate(self, namespace: str) -> None:
        assert self._legacy_dir is not None
        path = self._legacy_dir / f"{namespace}.json"
        for name, raw in _legacy_servers(path).items():
            server = _registration({"name": name, **raw}, legacy=True)
            try:
                await self._registry.put(namespace, server, only_if_absent=True)
            except AlreadyExists:
                pass  # registered since (by another replica, or a migration cut short)
        path.replace(path.with_name(path.name + ".migrated"))
        self._legacy.discard(namespace)
        log.info("namespace MCP servers migrated to the memory service", namespace=namespace, file=str(path))


def _registration(raw: Mapping[str, Any], *, legacy: bool = False) -> Registration:
    def strings(key: str) -> dict[str, str]:
        value = raw.get(key) or {}
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise InvalidArgument(f"MCP server {raw.get('name', '')!r}: {key} must map names to strings")
        return dict(value)

    args = raw.get("args") or []
    if not isinstance(args, (list, tuple)) or not all(isinstance(a, str) for a in args):
        raise InvalidArgument(f"MCP server {raw.get('name', '')!r}: args must be a list of strings")
    if legacy:  # a file of an earlier version: it held only these keys
        return Registration(name=str(raw["name"]), command=str(raw.get("command", "")), args=tuple(args),
                            url=str(raw.get("url", "")), headers=strings("headers"))
    server = Registration(name=str(raw.get("name", "")), command=str(raw.get("command") or ""), args=tuple(args),
                          url=str(raw.get("url") or ""), headers=strings("headers"), env_secrets=strings("env_secrets"),
                          header_secrets=strings("header_secrets"))
    if server.url and server.env_secrets:
        raise InvalidArgument(f"MCP server {server.name!r}: env_secrets are for stdio servers (a command); "
                              "an HTTP server takes header_secrets")
    if server.command and (server.header_secrets or server.headers):
        raise InvalidArgument(f"MCP server {server.name!r}: headers are for HTTP servers (a url); "
                              "a stdio server takes env_secrets")
    return server


def _legacy_servers(path: Path) -> dict[str, dict[str, Any]]:
    try:
        servers = json.loads(path.read_text())["mcpServers"]
        return servers if isinstance(servers, dict) else {}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        # Kept (renamed .migrated) for a person to look at; nothing in it could be read.
        log.warning("namespace MCP servers file unreadable", path=str(path), error=str(exc))
        return {}


def _check_started(name: str, connection: McpServerConnection) -> None:
    if not connection.available:
        raise FailedPrecondition(f"MCP server {name!r} was not added: it did not start: {connection.error}")
    for tool in connection.tools:
        try:
            check_schema(name, tool)
        except UnusableSchema as exc:
            raise InvalidArgument(f"{exc}; nothing was added") from None


def _status(server: Registration, available: bool, error: str, tools: list[str]) -> dict[str, Any]:
    """What `mcp list` shows: header values only when they are ${...} references, and secret
    references by name (never a value)."""
    headers = {k: (v if v.startswith("${") and v.endswith("}") else REDACTED) for k, v in server.headers.items()}
    return {"name": server.name, "command": server.command, "args": list(server.args), "url": server.url,
            "headers": headers, "env_secrets": dict(server.env_secrets), "header_secrets": dict(server.header_secrets),
            "available": available, "error": error, "tools": [catalog_name(server.name, tool) for tool in tools]}


def _check_sizes(server: Registration) -> None:
    values = [server.command, server.url, *server.args, *server.headers, *server.headers.values(),
              *server.env_secrets, *server.env_secrets.values(), *server.header_secrets, *server.header_secrets.values()]
    if len(server.args) > MAX_ARGS:
        raise InvalidArgument(f"MCP server {server.name!r}: at most {MAX_ARGS} arguments")
    if any(len(v) > MAX_VALUE_CHARS for v in values):
        raise InvalidArgument(f"MCP server {server.name!r}: a command, URL, argument, header or secret name is longer "
                              f"than {MAX_VALUE_CHARS} characters")
