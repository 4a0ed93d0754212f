"""A namespace's own MCP servers, as registered through the tools service (`agentmesh mcp add`):
kept here, beside the tool policy, so that every tools replica serves the same ones.

Documents (ports.DocumentStore), kind "mcp_server", keyed by the server's name: what the tools
service was given, checked and bounded here again — never a resolved secret (secret references
are names; the tools service resolves them when it starts a server). Each change moves the
namespace's `mcp_servers_version` (namespaces.py) *after* the document is written, so a replica
that sees the new version and reads the documents finds the change.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping

from agentmesh.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from agentmesh.ids import validate_namespace
from agentmesh.memory.namespaces import Namespaces
from agentmesh.memory.ports import DocumentStore

KIND = "mcp_server"
SERVER_NAME = re.compile(r"^[A-Za-z0-9-]{1,32}$")
SECRET_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}$")
MAX_SERVERS = 16
MAX_ARGS = 64
MAX_ITEMS = 32  # headers, env and header secrets, each
MAX_VALUE_CHARS = 4096


@dataclass(frozen=True)
class McpRegistration:
    name: str
    command: str = ""
    args: tuple[str, ...] = ()
    url: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    env_secrets: Mapping[str, str] = field(default_factory=dict)
    header_secrets: Mapping[str, str] = field(default_factory=dict)
    added_at: float = 0.0

    def payload(self) -> dict[str, Any]:
        body = asdict(self)
        body["args"] = list(self.args)
        return body

    @classmethod
    def from_payload(cls, p: Mapping[str, Any]) -> "McpRegistration":
        return cls(name=str(p["name"]), command=str(p.get("command", "")), args=tuple(p.get("args") or ()),
                   url=str(p.get("url", "")), headers=dict(p.get("headers") or {}),
                   env_secrets=dict(p.get("env_secrets") or {}), header_secrets=dict(p.get("header_secrets") or {}),
                   added_at=float(p.get("added_at", 0.0)))


def check(server: McpRegistration) -> None:
    """The form only (the tools service checked the program, the URL and the server itself)."""
    if not SERVER_NAME.match(server.name):
        raise InvalidArgument(f"MCP server name {server.name!r} must be 1-32 letters, digits or '-'")
    if bool(server.command) == bool(server.url):
        raise InvalidArgument(f"MCP server {server.name!r} needs exactly one of command or url")
    if len(server.args) > MAX_ARGS:
        raise InvalidArgument(f"MCP server {server.name!r}: at most {MAX_ARGS} arguments")
    for what, items in (("headers", server.headers), ("env_secrets", server.env_secrets),
                        ("header_secrets", server.header_secrets)):
        if len(items) > MAX_ITEMS:
            raise InvalidArgument(f"MCP server {server.name!r}: at most {MAX_ITEMS} {what}")
    values = [server.command, server.url, *server.args, *server.headers, *server.headers.values(),
              *server.env_secrets, *server.header_secrets]
    if any(len(v) > MAX_VALUE_CHARS for v in values):
        raise InvalidArgument(f"MCP server {server.name!r}: a value is longer than {MAX_VALUE_CHARS} characters")
    for what, items in (("env_secrets", server.env_secrets), ("header_secrets", server.header_secrets)):
        for key, secret in items.items():
            if not SECRET_NAME.match(secret):
                raise InvalidArgument(f"MCP server {server.name!r}: {what}.{key} names secret {secret!r}; a secret "
                                      "name is 1-63 letters, digits, '_', '.' or '-', not starting with '.' or '-'")


class McpRegistry:
    def __init__(self, documents: DocumentStore, namespaces: Namespaces, clock: Callable[[], float] = time.time):
        self._documents = documents
        self._namespaces = namespaces
        self._clock = clock

    async def list(self, namespace: str) -> tuple[list[McpRegistration], float]:
        namespace = validate_namespace(namespace or "default")
        # The version first: a change made between the two reads is then read again next time.
        version = (await self._namespaces.get(namespace)).mcp_servers_version
        servers = [McpRegistration.from_payload(body) for _, body in await self._documents.list_documents(KIND, namespace)]
        return servers, version

    async def put(self, namespace: str, server: McpRegistration, *, only_if_absent: bool = False) -> float:
        namespace = validate_namespace(namespace or "default")
        check(server)
        existing = await self._documents.list_documents(KIND, namespace)
        names = {key for key, _ in existing}
        if server.name in names and only_if_absent:
            raise AlreadyExists(f"namespace {namespace!r} already has an MCP server {server.name!r}; remove it first")
        if server.name not in names and len(names) >= MAX_SERVERS:
            raise FailedPrecondition(f"namespace {namespace!r} has {MAX_SERVERS} MCP servers, the most it may have")
        stored = McpRegistration(**{**asdict(server), "args": tuple(server.args),
                                    "added_at": server.added_at or round(self._clock(), 6)})
        await self._documents.put_document(KIND, namespace, server.name, stored.payload())
        return await self._namespaces.move_mcp_version(namespace)

    async def remove(self, namespace: str, name: str) -> float:
        namespace = validate_namespace(namespace or "default")
        if not await self._documents.delete_document(KIND, namespace, name):
            known = ", ".join(key for key, _ in await self._documents.list_documents(KIND, namespace))
            raise NotFound(f"namespace {namespace!r} has no MCP server {name!r}" + (f"; it has {known}" if known else ""))
        return await self._namespaces.move_mcp_version(namespace)
