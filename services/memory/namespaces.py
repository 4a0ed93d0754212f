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
    # Its own models (docs/agents.md#modelconfig), each a dict of NamespaceModel's fields; checked by `check_models`.
    models: list[dict[str, Any]] = field(default_factory=list)

    def retention_days(self) -> tuple[int, int, int, int]:
        """(transcripts, memories, usage, workspaces)."""
        return (self.transcripts_days, self.memories_days, self.usage_days, self.workspaces_days)

    def payload(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "tools_allow": list(self.tools_allow),
                "tools_deny": list(self.tools_deny), "updated_at": self.updated_at,
                "mcp_servers_version": self.mcp_servers_version, "transcripts_days": self.transcripts_days,
                "memories_days": self.memories_days, "usage_days": self.usage_days,
                "workspaces_days": self.workspaces_days, "sandbox_template": self.sandbox_template,
                "models": [dict(m) for m in self.models]}

    @classmethod
    def from_payload(cls, p: dict[str, Any]) -> "NamespaceRecord":
        return cls(namespace=p["namespace"], tools_allow=list(p.get("tools_allow") or []),
                   tools_deny=list(p.get("tools_deny") or []), updated_at=float(p.get("updated_at", 0.0)),
                   mcp_servers_version=float(p.get("mcp_servers_version", 0.0)),
                   transcripts_days=int(p.get("transcripts_days", 0)), memories_days=int(p.get("memories_days", 0)),
                   usage_days=int(p.get("usage_days", 0)), workspaces_days=int(p.get("workspaces_days", 0)),
                   sandbox_template=str(p.get("sandbox_template") or ""),
                   models=[dict(m) for m in p.get("models") or []])


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
                     sandbox_template: str | None = None,
                     models: list[dict[str, Any]] | None = None) -> NamespaceRecord:
        """Replace the namespace's tool policy (the gateway checked the names against the catalog),
        and its retention days (transcripts, memories, usage, workspaces), sandbox template and
        models when given."""
        if models is not None:
            check_models(models)
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
                                     sandbox_template=before.sandbox_template if sandbox_template is None else sandbox_template,
                                     models=before.models if models is None else models)
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


MAX_NAMESPACE_MODELS = 64
MODEL_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
# A Kubernetes Secret's name (a DNS subdomain) and one of its keys; never a path.
SECRET_NAME = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$")
SECRET_KEY = re.compile(r"^[A-Za-z0-9_.-]{1,253}$")


def check_models(models: list[dict[str, Any]]) -> None:
    """InvalidArgument, naming the entry and the field, for a malformed list of namespace models."""
    if len(models) > MAX_NAMESPACE_MODELS:
        raise InvalidArgument(f"models: at most {MAX_NAMESPACE_MODELS} per namespace, got {len(models)}", field="models")
    seen: set[str] = set()
    for m in models:
        name = str(m.get("name") or "")
        if not MODEL_NAME.match(name):
            raise InvalidArgument(f"models: {name[:80]!r} is not a model name (1-64 letters, digits, '.', '_' or '-')",
                                  field="models.name")
        if name in seen:
            raise InvalidArgument(f"models: the name {name!r} is given twice", field="models.name")
        seen.add(name)
        if m.get("provider") not in ("openai", "anthropic"):
            raise InvalidArgument(f"model {name!r}: provider must be openai or anthropic, got {str(m.get('provider'))[:40]!r}",
                                  field="models.provider")
        if not str(m.get("model") or "").strip() or len(str(m.get("model"))) > 256:
            raise InvalidArgument(f"model {name!r}: model (the id the provider's API knows it by, at most 256 "
                                  "characters) is required", field="models.model")
        base_url = str(m.get("base_url") or "")
        if base_url and not (base_url.startswith(("http://", "https://")) and len(base_url) <= 2048):
            raise InvalidArgument(f"model {name!r}: base_url must be an http(s) URL of at most 2048 characters",
                                  field="models.base_url")
        secret, key = str(m.get("api_key_secret") or ""), str(m.get("api_key_secret_key") or "")
        if (secret or key) and not (SECRET_NAME.match(secret) and SECRET_KEY.match(key) and key not in (".", "..")):
            raise InvalidArgument(f"model {name!r}: api_key_secret must name a Secret and one of its keys "
                                  f"(got {secret[:80]!r}, {key[:80]!r})", field="models.api_key_secret")
        temperature = m.get("temperature")
        if temperature is not None and not 0 <= float(temperature) <= 2:
            raise InvalidArgument(f"model {name!r}: temperature must be between 0 and 2", field="models.temperature")
        numbers = ("context_window", "max_output_tokens", "input_price_per_mtok", "output_price_per_mtok")
        if any(float(m.get(k) or 0) < 0 for k in numbers):
            raise InvalidArgument(f"model {name!r}: context_window, max_output_tokens and prices must not be negative",
                                  field="models")
        if m.get("fallback") == name:
            raise InvalidArgument(f"model {name!r} cannot fall back to itself", field="models.fallback")
