"""Promoted tools: Python functions the agent turned into tools (`promote_skill`), stored per
namespace with versions. The agent validates the function and derives its schema; this store
keeps what it was given, bounds it and caps how many tools a namespace may have.

Documents (ports.DocumentStore), kind "tool": `<name>` holds the latest version, `<name>@<version>`
each version. Nothing here runs the code: the agent runs a tool's calls in the sandbox.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import asdict, dataclass, replace
from typing import Callable

from agentmesh.errors import InvalidArgument, NotFound, ResourceExhausted
from agentmesh.ids import validate_namespace
from agentmesh.memory.ports import DocumentStore
from agentmesh.toolpolicy import AGENT_TOOLS

KIND = "tool"
NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
MAX_SOURCE_BYTES = 64 * 1024


@dataclass(frozen=True)
class PromotedTool:
    namespace: str
    name: str
    description: str
    parameters_json: str
    source: str
    function: str
    version: int = 0
    created_at: float = 0.0
    origin: str = ""


class PromotedTools:
    def __init__(self, documents: DocumentStore, *, max_tools: int, clock: Callable[[], float] = time.time):
        self._documents = documents
        self.max_tools = max_tools
        self._clock = clock
        self._lock = asyncio.Lock()

    async def put(self, tool: PromotedTool) -> PromotedTool:
        namespace = validate_namespace(tool.namespace)
        if not NAME.match(tool.name):
            raise InvalidArgument(f"{tool.name!r} is not a tool name: use 1-64 characters from a-z, 0-9 and '_', "
                                  "starting with a letter")
        # The names memory can tell are taken without the tools service's catalogue (the agent
        # checks that one): a self-made tool must never stand in for another tool.
        if "__" in tool.name or tool.name in AGENT_TOOLS:
            raise InvalidArgument(f"{tool.name!r} is another tool's name (the agent's own, or an MCP server's "
                                  "server__tool); a self-made tool may not take it")
        if not tool.description.strip() or not tool.function:
            raise InvalidArgument("a promoted tool needs a description (its docstring) and a function name")
        try:
            schema = json.loads(tool.parameters_json)
        except json.JSONDecodeError:
            raise InvalidArgument("parameters_json is not JSON") from None
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise InvalidArgument("parameters_json must be a JSON schema of type 'object'")
        if len(tool.source.encode()) > MAX_SOURCE_BYTES:
            raise InvalidArgument(f"the tool's source is over {MAX_SOURCE_BYTES} bytes")
        async with self._lock:
            latest = await self._documents.get_document(KIND, namespace, tool.name)
            if latest is None:
                names = {key for key, _ in await self._documents.list_documents(KIND, namespace) if "@" not in key}
                if len(names) >= self.max_tools:
                    raise ResourceExhausted(
                        f"namespace {namespace!r} has {len(names)} promoted tools, the most it may have; remove one "
                        "(`agentmesh skills remove NAME --tool`) or raise AGENTMESH_PROMOTED_TOOLS_MAX")
            version = int(latest["version"]) + 1 if latest else 1
            stored = replace(tool, namespace=namespace, version=version, created_at=self._clock())
            await self._documents.put_document(KIND, namespace, f"{tool.name}@{version}", asdict(stored))
            await self._documents.put_document(KIND, namespace, tool.name, asdict(stored))
        return stored

    async def list(self, namespace: str) -> list[PromotedTool]:
        namespace = validate_namespace(namespace)
        return [PromotedTool(**body) for key, body in await self._documents.list_documents(KIND, namespace)
                if "@" not in key]

    async def remove(self, namespace: str, name: str) -> int:
        namespace = validate_namespace(namespace)
        async with self._lock:
            latest = await self._documents.get_document(KIND, namespace, name)
            if latest is None:
                raise NotFound(f"there is no promoted tool {name!r} in namespace {namespace!r}")
            await self._documents.delete_document(KIND, namespace, name)
            for version in range(1, int(latest["version"]) + 1):
                await self._documents.delete_document(KIND, namespace, f"{name}@{version}")
        return int(latest["version"])
