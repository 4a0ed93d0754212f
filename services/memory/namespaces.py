"""A namespace's settings, kept beside its sessions: the tool policy its sessions start from
(docs/approvals.md#tool-policy), and the version of its own MCP servers (mcp_registry.py), which
the gateway reads with the policy for every turn. One record per namespace; one never set reads
as the defaults."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from agentmesh.ids import validate_namespace
from agentmesh.memory.ports import NamespaceSettingsStore
from agentmesh.toolpolicy import validate_policy


@dataclass
class NamespaceRecord:
    namespace: str
    tools_allow: list[str] = field(default_factory=list)
    tools_deny: list[str] = field(default_factory=list)
    updated_at: float = 0.0  # 0: never set
    mcp_servers_version: float = 0.0  # 0: no MCP server was ever registered

    def payload(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "tools_allow": list(self.tools_allow),
                "tools_deny": list(self.tools_deny), "updated_at": self.updated_at,
                "mcp_servers_version": self.mcp_servers_version}

    @classmethod
    def from_payload(cls, p: dict[str, Any]) -> "NamespaceRecord":
        return cls(namespace=p["namespace"], tools_allow=list(p.get("tools_allow") or []),
                   tools_deny=list(p.get("tools_deny") or []), updated_at=float(p.get("updated_at", 0.0)),
                   mcp_servers_version=float(p.get("mcp_servers_version", 0.0)))


class Namespaces:
    def __init__(self, store: NamespaceSettingsStore):
        self._store = store
        # One record holds both the policy and the MCP version: its read-modify-writes are
        # serialised here (within a replica; across replicas two changes in the same instant
        # may lose one version move, which the next change repairs).
        self._lock = asyncio.Lock()

    async def get(self, namespace: str) -> NamespaceRecord:
        namespace = validate_namespace(namespace or "default")
        payload = await self._store.get_namespace_settings(namespace)
        return NamespaceRecord.from_payload(payload) if payload else NamespaceRecord(namespace)

    async def update(self, namespace: str, allow: list[str], deny: list[str]) -> NamespaceRecord:
        """Replace the namespace's tool policy (the gateway checked the names against the catalog)."""
        namespace = validate_namespace(namespace or "default")
        policy = validate_policy(allow, deny, "tools")
        async with self._lock:
            before = await self.get(namespace)
            record = NamespaceRecord(namespace, list(policy.allow), list(policy.deny), round(time.time(), 6),
                                     before.mcp_servers_version)
            await self._store.put_namespace_settings(record.payload())
        return record

    async def move_mcp_version(self, namespace: str) -> float:
        """A new mcp_servers_version for the namespace (its servers changed): later than the
        last one, whatever the clock says."""
        namespace = validate_namespace(namespace or "default")
        async with self._lock:
            record = await self.get(namespace)
            record.mcp_servers_version = max(round(time.time(), 6), round(record.mcp_servers_version + 1e-6, 6))
            await self._store.put_namespace_settings(record.payload())
        return record.mcp_servers_version
