"""A namespace's settings, kept beside its sessions: the tool policy its sessions start from
(docs/approvals.md#tool-policy). One record per namespace; one never set reads as the defaults."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from agentmesh.ids import validate_namespace
from agentmesh.memory.ports import Store
from agentmesh.toolpolicy import validate_policy


@dataclass
class NamespaceRecord:
    namespace: str
    tools_allow: list[str] = field(default_factory=list)
    tools_deny: list[str] = field(default_factory=list)
    updated_at: float = 0.0  # 0: never set

    def payload(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "tools_allow": list(self.tools_allow),
                "tools_deny": list(self.tools_deny), "updated_at": self.updated_at}

    @classmethod
    def from_payload(cls, p: dict[str, Any]) -> "NamespaceRecord":
        return cls(namespace=p["namespace"], tools_allow=list(p.get("tools_allow") or []),
                   tools_deny=list(p.get("tools_deny") or []), updated_at=float(p.get("updated_at", 0.0)))


class Namespaces:
    def __init__(self, store: Store):
        self._store = store

    async def get(self, namespace: str) -> NamespaceRecord:
        namespace = validate_namespace(namespace or "default")
        payload = await self._store.get_namespace_settings(namespace)
        return NamespaceRecord.from_payload(payload) if payload else NamespaceRecord(namespace)

    async def update(self, namespace: str, allow: list[str], deny: list[str]) -> NamespaceRecord:
        """Replace the namespace's tool policy (the gateway checked the names against the catalog)."""
        namespace = validate_namespace(namespace or "default")
        policy = validate_policy(allow, deny, "tools")
        record = NamespaceRecord(namespace, list(policy.allow), list(policy.deny), round(time.time(), 6))
        await self._store.put_namespace_settings(record.payload())
        return record
