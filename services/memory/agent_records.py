"""`ports.AgentStore` over a document store's own methods: both document adapters
(`edge_documents.EdgeDocuments`, `qdrant_documents.QdrantDocuments`) mix this in, so named agents
live where skills and standing instructions do (embedded under AGENTMESH_HOME, or the Qdrant server
of a cluster) with no collection of their own.

Kinds: "agent" holds a head per name (key: the name); "agent-version" one record per version (key:
`<name>@<version, 8 digits>`, so a listing by key is a listing by version)."""

from __future__ import annotations

from typing import Any

__all__ = ["AgentRecords"]

HEAD_KIND = "agent"
VERSION_KIND = "agent-version"


def _version_key(name: str, version: int) -> str:
    return f"{name}@{version:08d}"


class AgentRecords:
    """Mixed into a document adapter, which supplies get/put/delete/list_document."""

    async def get_document(self, kind: str, namespace: str, key: str) -> dict[str, Any] | None:
        raise NotImplementedError

    async def put_document(self, kind: str, namespace: str, key: str, payload: dict[str, Any]) -> None:
        raise NotImplementedError

    async def delete_document(self, kind: str, namespace: str, key: str) -> bool:
        raise NotImplementedError

    async def list_documents(self, kind: str, namespace: str) -> list[tuple[str, dict[str, Any]]]:
        raise NotImplementedError

    async def put_agent_version(self, namespace: str, payload: dict[str, Any]) -> bool:
        key = _version_key(payload["name"], int(payload["version"]))
        # Immutable: the caller (agents.py) numbers versions under a lock, so this check is the
        # port's promise, not a race guard across processes.
        if await self.get_document(VERSION_KIND, namespace, key) is not None:
            return False
        await self.put_document(VERSION_KIND, namespace, key, dict(payload))
        return True

    async def get_agent_version(self, namespace: str, name: str, version: int) -> dict[str, Any] | None:
        return await self.get_document(VERSION_KIND, namespace, _version_key(name, version))

    async def list_agent_versions(self, namespace: str, name: str) -> list[dict[str, Any]]:
        prefix = f"{name}@"
        return [dict(p) for key, p in await self.list_documents(VERSION_KIND, namespace) if key.startswith(prefix)]

    async def put_agent_head(self, namespace: str, payload: dict[str, Any]) -> None:
        await self.put_document(HEAD_KIND, namespace, payload["name"], dict(payload))

    async def list_agent_heads(self, namespace: str) -> list[dict[str, Any]]:
        return [dict(p) for _, p in await self.list_documents(HEAD_KIND, namespace)]

    async def delete_agent(self, namespace: str, name: str) -> int:
        # Head first: once it is gone the name is free, and a version left by a crash between the
        # two steps is never read (versions are reached through their head).
        await self.delete_document(HEAD_KIND, namespace, name)
        removed = 0
        for payload in await self.list_agent_versions(namespace, name):
            if await self.delete_document(VERSION_KIND, namespace, _version_key(name, int(payload["version"]))):
                removed += 1
        return removed
