"""`ModelConfig` resources (agentmesh.dev/v1alpha1, docs/agents.md#modelconfig) become their
namespace's own models, by the Agent controller's loop (agent_controller.py) on the leading
scheduler: each pass makes the namespace's models (its settings in the memory service, through
the gateway) what its resources say, and writes each resource's status.

The key stays a reference: `spec.apiKeySecret` is stored as the Secret's name and key, and the
agent reads the key from the Secret the operator mounts for it. The scheduler never reads
Secrets, so a missing Secret is not something a status here can say (the turn that uses the model
says it); a malformed spec, a name the deployment's catalogue has, or a fallback to no known model is.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Protocol

from agentmesh.clients.gateway import GatewayClient
from agentmesh.logs import get_logger
from agentmesh.scheduler.agent_controller import DefinitionRejected, Outcome
from agentmesh.scheduler.agent_resources import ControllerCalls
from agentmesh.v1 import gateway_pb2, sessions_pb2

__all__ = ["PLURAL", "GatewayNamespaceModels", "NamespaceModelStore", "entry_of", "reconcile_models"]

log = get_logger("agentmesh.scheduler.model_resources")

PLURAL = "modelconfigs"
NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
SPEC_FIELDS = {"provider", "model", "baseUrl", "contextWindow", "maxOutputTokens", "temperature", "fallback", "vision",
               "prices", "apiKeySecret"}


class NamespaceModelStore(Protocol):
    async def deployment_models(self) -> list[str]:
        """The deployment's catalogue names (ListModels without a namespace)."""

    async def models(self, namespace: str) -> list[dict[str, Any]]:
        """The namespace's models as stored (entry_of's shape)."""

    async def set_models(self, namespace: str, models: list[dict[str, Any]]) -> None:
        """Replace them; DefinitionRejected when the gateway refuses (INVALID_ARGUMENT)."""


def entry_of(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """The stored entry (NamespaceModel's fields) of a ModelConfig's spec; DefinitionRejected,
    naming the field, when the spec is not one."""
    if not NAME.match(name):
        raise DefinitionRejected(f"the name {name!r} is not a model name (1-64 letters, digits, '.', '_' or '-')")
    unknown = sorted(set(spec) - SPEC_FIELDS)
    if unknown:
        raise DefinitionRejected(f"spec has unknown field(s) {', '.join(unknown)}")
    if spec.get("provider") not in ("openai", "anthropic"):
        raise DefinitionRejected(f"spec.provider must be openai or anthropic, got {spec.get('provider')!r}")
    if not str(spec.get("model") or "").strip():
        raise DefinitionRejected("spec.model is required: the id the provider's API knows the model by")
    secret = spec.get("apiKeySecret") or {}
    prices = spec.get("prices") or {}
    try:
        entry: dict[str, Any] = {
            "name": name, "provider": spec["provider"], "model": str(spec["model"]),
            "base_url": str(spec.get("baseUrl") or ""), "context_window": int(spec.get("contextWindow") or 0),
            "max_output_tokens": int(spec.get("maxOutputTokens") or 0), "fallback": str(spec.get("fallback") or ""),
            "no_vision": spec.get("vision") is False,
            "input_price_per_mtok": float(prices.get("inputPerMtok") or 0),
            "output_price_per_mtok": float(prices.get("outputPerMtok") or 0),
            "api_key_secret": str(secret.get("name") or ""), "api_key_secret_key": str(secret.get("key") or ""),
        }
        if spec.get("temperature") is not None:
            entry["temperature"] = float(spec["temperature"])
    except (TypeError, ValueError, AttributeError) as exc:
        raise DefinitionRejected(f"a number field of spec holds something else ({exc})") from None
    return entry


async def reconcile_models(namespace: str, resources: list[dict[str, Any]],
                           store: NamespaceModelStore) -> dict[str, Outcome]:
    """Make the namespace's models what its resources say; the outcome per resource name. A
    resource that is not Ready is left out (a model no resource defines is removed)."""
    deployment = set(await store.deployment_models())
    entries: dict[str, dict[str, Any]] = {}
    outcomes: dict[str, Outcome] = {}
    for resource in sorted(resources, key=lambda r: r["metadata"]["name"]):
        name = resource["metadata"]["name"]
        try:
            entries[name] = entry_of(name, resource.get("spec") or {})
        except DefinitionRejected as exc:
            outcomes[name] = Outcome(False, "InvalidSpec", str(exc))
            continue
        if name in deployment:
            del entries[name]
            outcomes[name] = Outcome(False, "NameTaken", f"the deployment's catalogue has a model {name!r}; "
                                     "a namespace's own model needs a name of its own")
    for name, entry in list(entries.items()):
        fallback = entry["fallback"]
        if fallback and fallback not in entries and fallback not in deployment:
            del entries[name]
            outcomes[name] = Outcome(False, "ModelNotFound", f"fallback {fallback!r} is neither the deployment's "
                                     f"model nor a ModelConfig of namespace {namespace!r}")
    wanted = [entries[n] for n in sorted(entries)]
    if wanted != await store.models(namespace):
        try:
            await store.set_models(namespace, wanted)
        except DefinitionRejected as exc:
            return {**outcomes, **{n: Outcome(False, "InvalidSpec", str(exc)) for n in entries}}
        log.info("namespace models synced", namespace=namespace, models=",".join(sorted(entries)))
    for name, entry in entries.items():
        key = (f"; its key is key {entry['api_key_secret_key']!r} of Secret {entry['api_key_secret']!r}, read by the "
               "agent from its mounts (not checked here)") if entry["api_key_secret"] else ""
        outcomes[name] = Outcome(True, "Synced", f"model {name!r} is usable in namespace {namespace!r}{key}")
    return outcomes


_STORED = ("name", "provider", "model", "base_url", "context_window", "max_output_tokens", "fallback", "no_vision",
           "input_price_per_mtok", "output_price_per_mtok", "api_key_secret", "api_key_secret_key")


def _entry_of_proto(m: sessions_pb2.NamespaceModel) -> dict[str, Any]:
    entry: dict[str, Any] = {k: getattr(m, k) for k in _STORED}
    if m.HasField("temperature"):
        entry["temperature"] = m.temperature
    return entry


class GatewayNamespaceModels(ControllerCalls):
    """The namespace's models through the gateway's namespace settings, signed as the Agent
    controller's are (agent_resources.py). `on_change(namespace)`: after the models changed (the
    Agent controller relists, as an Agent may name one)."""

    rejected = "the gateway refused the models"

    def __init__(self, gateway: GatewayClient, owner_of: Callable[[str], str | None] | None = None,
                 on_change: Callable[[str], None] | None = None, timeout_s: float = 30.0):
        super().__init__(gateway, owner_of, timeout_s)
        self.on_change = on_change

    async def deployment_models(self) -> list[str]:
        listed = await self._call("ListModels", gateway_pb2.ListModelsRequest(), "")
        return [m.name for m in listed.models]

    async def models(self, namespace: str) -> list[dict[str, Any]]:
        settings = await self._call("GetNamespaceSettings", sessions_pb2.GetNamespaceSettingsRequest(namespace=namespace),
                                    namespace)
        return [_entry_of_proto(m) for m in settings.models]

    async def set_models(self, namespace: str, models: list[dict[str, Any]]) -> None:
        # The namespace's tool policy is replaced by every update: it is sent back as it is.
        settings = await self._call("GetNamespaceSettings", sessions_pb2.GetNamespaceSettingsRequest(namespace=namespace),
                                    namespace)
        request = sessions_pb2.UpdateNamespaceSettingsRequest(
            namespace=namespace, tools=settings.tools,
            models=sessions_pb2.NamespaceModels(models=[sessions_pb2.NamespaceModel(**m) for m in models]))
        await self._call("UpdateNamespaceSettings", request, namespace)
        if self.on_change is not None:
            self.on_change(namespace)
