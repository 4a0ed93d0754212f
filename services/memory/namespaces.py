"""A namespace's settings, kept beside its sessions: the tool policy its sessions start from
(docs/approvals.md#tool-policy), and the version of its own MCP servers (mcp_registry.py), which
the gateway reads with the policy for every turn. One record per namespace; one never set reads
as the defaults."""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from typing import Any

from agentmesh.errors import InvalidArgument
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
    # Retention in days (retention.py, docs/memory.md#retention); 0: kept for ever.
    transcripts_days: int = 0
    memories_days: int = 0
    usage_days: int = 0
    workspaces_days: int = 0
    sandbox_template: str = ""  # "": the deployment's default (docs/tools.md#sandbox-templates)

    def retention_days(self) -> tuple[int, int, int, int]:
        """(transcripts, memories, usage, workspaces)."""
        return (self.transcripts_days, self.memories_days, self.usage_days, self.workspaces_days)

    def payload(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "tools_allow": list(self.tools_allow),
                "tools_deny": list(self.tools_deny), "updated_at": self.updated_at,
                "mcp_servers_version": self.mcp_servers_version, "transcripts_days": self.transcripts_days,
                "memories_days": self.memories_days, "usage_days": self.usage_days,
                "workspaces_days": self.workspaces_days, "sandbox_template": self.sandbox_template}

    @classmethod
    def from_payload(cls, p: dict[str, Any]) -> "NamespaceRecord":
        return cls(namespace=p["namespace"], tools_allow=list(p.get("tools_allow") or []),
                   tools_deny=list(p.get("tools_deny") or []), updated_at=float(p.get("updated_at", 0.0)),
                   mcp_servers_version=float(p.get("mcp_servers_version", 0.0)),
                   transcripts_days=int(p.get("transcripts_days", 0)), memories_days=int(p.get("memories_days", 0)),
                   usage_days=int(p.get("usage_days", 0)), workspaces_days=int(p.get("workspaces_days", 0)),
                   sandbox_template=str(p.get("sandbox_template") or ""))


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

    async def update(self, namespace: str, allow: list[str], deny: list[str],
                     retention: tuple[int, int, int, int] | None = None,
                     sandbox_template: str | None = None) -> NamespaceRecord:
        """Replace the namespace's tool policy (the gateway checked the names against the catalog),
        and its retention days (transcripts, memories, usage, workspaces) and sandbox template when given."""
        if sandbox_template and not TEMPLATE_NAME.match(sandbox_template):
            raise InvalidArgument(f"sandbox_template {sandbox_template[:80]!r} is not a template name (1-63 lower-case "
                                  "letters, digits or '-'; agentmesh sandbox templates lists them)", field="sandbox_template")
        namespace = validate_namespace(namespace or "default")
        policy = validate_policy(allow, deny, "tools")
        if retention is not None:
            _check_retention(retention)
        async with self._lock:
            before = await self.get(namespace)
            days = retention if retention is not None else (
                before.transcripts_days, before.memories_days, before.usage_days, before.workspaces_days)
            record = NamespaceRecord(namespace, list(policy.allow), list(policy.deny), round(time.time(), 6),
                                     before.mcp_servers_version, *days,
                                     sandbox_template=before.sandbox_template if sandbox_template is None else sandbox_template)
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


MAX_RETENTION_DAYS = 36_500
TEMPLATE_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def _check_retention(days: tuple[int, int, int, int]) -> None:
    for name, value in zip(("transcripts_days", "memories_days", "usage_days", "workspaces_days"), days, strict=True):
        if value < 0 or value > MAX_RETENTION_DAYS:
            raise InvalidArgument(f"retention.{name} must be between 0 (keep) and {MAX_RETENTION_DAYS} days, "
                                  f"got {value}", field=f"retention.{name}")
