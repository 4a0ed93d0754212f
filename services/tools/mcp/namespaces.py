"""Each namespace's own MCP servers (`agentmesh mcp add|list|remove`, the gateway's
AddMcpServer / ListMcpServers / RemoveMcpServer).

A server is checked before it is kept: the entry parses as a deployment entry would (a stdio
command must be found; API entries get no mounts, no network and no env), an HTTP URL must be
allowed by the egress policy, the server must start and list its tools, and every tool's schema
must be one a model can fill. Only then is the entry written to the namespace's file,
`$AGENTMESH_HOME/mcp/namespaces/<namespace>.json` (the deployment file's shape), and its tools
join that namespace's catalog — and no other's. After a restart a namespace's servers are started
again the first time the namespace is used.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any, Callable, Mapping

from opentelemetry import trace

from agentmesh.config import ConfigError
from agentmesh.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from agentmesh.logs import get_logger
from agentmesh.tools.catalog import Tool
from agentmesh.tools.mcp.config import McpServerEntry, parse_entry
from agentmesh.tools.mcp.connection import McpServerConnection, ServerUnavailable
from agentmesh.tools.mcp.openers import check_egress
from agentmesh.tools.mcp.tools import McpTools, UnusableSchema, catalog_name, check_schema
from agentmesh.tools.settings import SandboxLimits
from agentmesh.tools.web_tools import AddressPolicy

log = get_logger("agentmesh.tools.mcp")

MAX_SERVERS_PER_NAMESPACE = 16
MAX_ARGS = 64
MAX_VALUE_CHARS = 4096
REDACTED = "(redacted)"

# (entry, directory for its files, namespace) -> its supervised connection
ConnectionMaker = Callable[[McpServerEntry, Path, str], McpServerConnection]


class NamespaceServers:
    def __init__(self, store: Path, connect: ConnectionMaker, policy: AddressPolicy, limits: SandboxLimits,
                 attachment_cap_bytes: int, secrets: Mapping[str, str], reserved: Callable[[], set[str]],
                 tracer: trace.Tracer | None = None, sandbox: str = "local"):
        self._store = store
        self._sandbox = sandbox  # where stdio servers run: "local" (the jail) or "kubernetes" (pods)
        self._connect = connect
        self._policy = policy
        self._limits = limits
        self._cap = attachment_cap_bytes
        self._secrets = secrets
        self._reserved = reserved  # names of the deployment's own servers
        self._tracer = tracer
        self._providers: dict[str, McpTools] = {}
        self._raw: dict[str, dict[str, dict[str, Any]]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def _file(self, namespace: str) -> Path:
        return self._store / f"{namespace}.json"

    def _lock(self, namespace: str) -> asyncio.Lock:
        return self._locks.setdefault(namespace, asyncio.Lock())

    # --- the catalog of a namespace ---------------------------------------------------------

    async def provider(self, namespace: str, create: bool = False) -> McpTools | None:
        """The namespace's servers, started on first use; None when it has none (and `create` is
        false: nothing is kept for namespaces without servers, whatever names callers send)."""
        if not namespace:
            return None
        if namespace in self._providers:
            return self._providers[namespace]
        if not create and not self._file(namespace).exists():
            return None
        async with self._lock(namespace):
            if namespace not in self._providers:
                raw = self._read(namespace)
                provider = McpTools([], self._limits, self._cap, self._tracer)
                for name, entry in raw.items():
                    try:
                        connection = self._connect(parse_entry(name, entry, self._secrets, self._sandbox), self._root(namespace),
                                                   namespace)
                    except ConfigError as exc:  # e.g. a secret removed from the environment since
                        log.warning("namespace MCP server left out", namespace=namespace, server=name, error=str(exc))
                        continue
                    await connection.start()
                    provider.add(connection)
                self._raw[namespace] = raw
                self._providers[namespace] = provider
        return self._providers[namespace]

    async def tools(self, namespace: str) -> list[Tool]:
        provider = await self.provider(namespace)
        return provider.tools() if provider else []

    async def find(self, namespace: str, name: str) -> Tool | None:
        provider = await self.provider(namespace)
        return provider.find(name) if provider else None

    # --- add, list, remove ------------------------------------------------------------------

    async def add(self, namespace: str, raw: dict[str, Any]) -> dict[str, Any]:
        name = str(raw.get("name", ""))
        entry_raw = {k: v for k, v in raw.items() if k != "name" and v}
        _check_sizes(name, entry_raw)
        try:
            entry = parse_entry(name, entry_raw, self._secrets, self._sandbox)
        except ConfigError as exc:
            raise InvalidArgument(str(exc)) from None
        provider = await self.provider(namespace, create=True)
        assert provider is not None
        async with self._lock(namespace):
            if name in self._reserved():
                raise AlreadyExists(f"MCP server {name!r} is one of the deployment's (AGENTMESH_MCP_SERVERS); choose another name")
            if name in provider.names():
                raise AlreadyExists(f"namespace {namespace!r} already has an MCP server {name!r}; remove it first")
            if len(provider.names()) >= MAX_SERVERS_PER_NAMESPACE:
                raise FailedPrecondition(f"namespace {namespace!r} has {MAX_SERVERS_PER_NAMESPACE} MCP servers, the most it may have")
            if entry.url:
                try:
                    await check_egress(entry.url, self._policy)
                except ServerUnavailable as exc:
                    raise FailedPrecondition(f"MCP server {name!r}: {exc}") from None
            try:
                connection = self._connect(entry, self._root(namespace), namespace)
            except ConfigError as exc:
                raise FailedPrecondition(str(exc)) from None
            await connection.start()
            problem = "" if connection.available else f"it did not start: {connection.error}"
            for tool in connection.tools:
                try:
                    check_schema(name, tool)
                except UnusableSchema as exc:
                    problem = str(exc)
                    break
            if problem:
                await connection.close()
                if problem.startswith("MCP server"):
                    raise InvalidArgument(problem + "; nothing was added")
                raise FailedPrecondition(f"MCP server {name!r} was not added: {problem}")
            raw_store = dict(self._raw.get(namespace, {}))
            raw_store[name] = entry_raw
            self._write(namespace, raw_store)
            self._raw[namespace] = raw_store
            provider.add(connection)
        log.info("namespace MCP server added", namespace=namespace, server=name, tools=len(connection.tools))
        return self._status(name, entry_raw, connection)

    async def list(self, namespace: str) -> list[dict[str, Any]]:
        provider = await self.provider(namespace)
        raw = self._raw.get(namespace, {})
        statuses = provider.status() if provider else {}
        return [{"name": name, **_redacted(raw.get(name, {})), "available": status["available"], "error": status["error"],
                 "tools": [catalog_name(name, tool) for tool in status["tools"]]}
                for name, status in sorted(statuses.items())]

    async def remove(self, namespace: str, name: str) -> None:
        provider = await self.provider(namespace)
        async with self._lock(namespace):
            if provider is None or name not in provider.names():
                known = ", ".join(sorted(provider.names())) if provider else ""
                raise NotFound(f"namespace {namespace!r} has no MCP server {name!r}" + (f"; it has {known}" if known else ""))
            raw_store = {k: v for k, v in self._raw.get(namespace, {}).items() if k != name}
            self._write(namespace, raw_store)
            self._raw[namespace] = raw_store
            await provider.remove(name)
        log.info("namespace MCP server removed", namespace=namespace, server=name)

    async def close(self) -> None:
        await asyncio.gather(*(p.close() for p in self._providers.values()))

    # --- storage ----------------------------------------------------------------------------

    def _root(self, namespace: str) -> Path:
        # Stdio servers' working directories; the suffix keeps "." and ".." (valid namespaces) inside.
        return self._store / f"{namespace}.servers"

    def _read(self, namespace: str) -> dict[str, dict[str, Any]]:
        path = self._file(namespace)
        if not path.exists():
            return {}
        try:
            document = json.loads(path.read_text())
            servers = document["mcpServers"]
            return servers if isinstance(servers, dict) else {}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("namespace MCP servers unreadable", namespace=namespace, path=str(path), error=str(exc))
            return {}

    def _write(self, namespace: str, servers: dict[str, dict[str, Any]]) -> None:
        self._store.mkdir(parents=True, exist_ok=True)
        path = self._file(namespace)
        temporary = path.with_suffix(".json.tmp")
        temporary.write_text(json.dumps({"mcpServers": servers}, indent=2))
        os.chmod(temporary, 0o600)  # header values may be tokens
        temporary.replace(path)

    def _status(self, name: str, raw: dict[str, Any], connection: McpServerConnection) -> dict[str, Any]:
        return {"name": name, **_redacted(raw), "available": connection.available, "error": connection.error,
                "tools": [catalog_name(name, t.name) for t in connection.tools]}


def _redacted(raw: Mapping[str, Any]) -> dict[str, Any]:
    shown = dict(raw)
    if "headers" in shown:
        shown["headers"] = {k: (v if v.startswith("${") and v.endswith("}") else REDACTED) for k, v in shown["headers"].items()}
    return shown


def _check_sizes(name: str, raw: Mapping[str, Any]) -> None:
    values = [raw.get("command", ""), raw.get("url", ""), *raw.get("args", ()), *dict(raw.get("headers", {})).keys(),
              *dict(raw.get("headers", {})).values()]
    if len(raw.get("args", ())) > MAX_ARGS:
        raise InvalidArgument(f"MCP server {name!r}: at most {MAX_ARGS} arguments")
    if any(len(str(v)) > MAX_VALUE_CHARS for v in values):
        raise InvalidArgument(f"MCP server {name!r}: a command, URL, argument or header is longer than {MAX_VALUE_CHARS} characters")
