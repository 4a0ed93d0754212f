"""The controller of `Agent` resources (agentmesh.dev/v1alpha1, docs/agents.md): on the leading
scheduler only, it keeps the named agents of each managed namespace equal to the resources in the
Kubernetes namespace of the same name, and writes each resource's status.

Level-triggered: every event of a namespace's watch, and every relist (when the watch ends, at
least every `resync_s`), reconciles the whole namespace from what is listed — so a change missed
while no replica led (a resource deleted meanwhile) is caught up on the next pass, without a
finalizer on the resources. The ports: `AgentResources` (the Kubernetes API, agent_resources.py)
and `AgentDefinitions` (the gateway's agent RPCs, agent_resources.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, AsyncGenerator, Awaitable, Callable, Protocol

from agentmesh.logs import get_logger

__all__ = ["AgentController", "AgentDefinitions", "AgentResources", "DefinitionRejected", "Outcome", "Reconcile", "StoredAgent",
           "reconcile_namespace", "run_controller_while_leading", "status_of"]

log = get_logger("agentmesh.scheduler.agent_controller")


class DefinitionRejected(Exception):
    """A malformed spec, or one the gateway refused (INVALID_ARGUMENT): the resource is wrong, not
    the moment."""


@dataclass(frozen=True)
class StoredAgent:
    name: str
    version: int  # the current one
    builtin: bool
    spec: dict[str, Any]  # the resource's spec shape (docs/agents.md), as stored


class AgentResources(Protocol):
    async def list_resources(self, namespace: str) -> tuple[list[dict[str, Any]], str]:
        """The namespace's Agent resources and the list's resourceVersion."""

    def watch(self, namespace: str, resource_version: str,
              timeout_s: float) -> AsyncGenerator[tuple[str, dict[str, Any]], None]:
        """(event type, object) after resource_version, until the server ends the watch."""

    async def write_status(self, namespace: str, name: str, status: dict[str, Any]) -> None: ...


class AgentDefinitions(Protocol):
    """A namespace's agents, in the resource's spec shape; `create` and `update` answer the version made."""

    def canonical(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        """The spec as it would be stored (so an unchanged resource compares equal to its agent);
        DefinitionRejected when it is malformed."""

    async def agents(self, namespace: str) -> list[StoredAgent]: ...

    async def models(self, namespace: str) -> list[str]:
        """The model catalogue's names (ListModels), as the namespace's callers see it."""

    async def create(self, namespace: str, name: str, spec: dict[str, Any]) -> int: ...

    async def update(self, namespace: str, name: str, spec: dict[str, Any]) -> int: ...

    async def delete(self, namespace: str, name: str) -> None: ...


@dataclass(frozen=True)
class Outcome:
    """What a pass made of one resource: its Ready condition and the agent version it points at."""

    ready: bool
    reason: str  # CamelCase, as a Kubernetes condition's reason
    message: str
    version: int = 0


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_of(resource: dict[str, Any], outcome: Outcome) -> dict[str, Any]:
    """The status to write; the Ready condition keeps its lastTransitionTime while its status holds."""
    generation = int(resource.get("metadata", {}).get("generation") or 0)
    previous: dict[str, Any] = next((c for c in (resource.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), {})
    state = "True" if outcome.ready else "False"
    condition = {"type": "Ready", "status": state, "reason": outcome.reason, "message": outcome.message[:1000],
                 "observedGeneration": generation,
                 "lastTransitionTime": previous.get("lastTransitionTime") if previous.get("status") == state else _now()}
    status: dict[str, Any] = {"observedGeneration": generation, "conditions": [condition]}
    if outcome.version:
        status["version"] = outcome.version
    return status


def _same_status(resource: dict[str, Any], status: dict[str, Any]) -> bool:
    return (resource.get("status") or {}) == status


async def reconcile_namespace(namespace: str, resources: list[dict[str, Any]],
                              definitions: AgentDefinitions) -> dict[str, Outcome]:
    """Make the namespace's agents what its resources say; the outcome per resource name.
    A resource that is not Ready changes nothing (the agent keeps its last good version);
    an agent with no resource is deleted (a built-in it overrode comes back)."""
    infos = await definitions.agents(namespace)
    stored = {i.name: i for i in infos if not i.builtin}
    builtins = {i.name for i in infos if i.builtin}
    models: set[str] = set(await definitions.models(namespace))
    names = {r["metadata"]["name"] for r in resources}
    outcomes: dict[str, Outcome] = {}
    for resource in sorted(resources, key=lambda r: r["metadata"]["name"]):
        name = resource["metadata"]["name"]
        try:
            spec = definitions.canonical(name, resource.get("spec") or {})
        except DefinitionRejected as exc:
            outcomes[name] = Outcome(False, "InvalidSpec", str(exc))
            continue
        model = spec.get("model") or ""
        if model and model not in models:
            outcomes[name] = Outcome(False, "ModelNotFound", f"model {model!r} is neither the deployment's nor a "
                                     f"ModelConfig of namespace {namespace!r} (models: {', '.join(sorted(models)) or 'none'})")
            continue
        missing = [a for a in spec.get("subAgents") or [] if a not in names and a not in builtins and a not in stored]
        if missing:
            outcomes[name] = Outcome(False, "SubAgentNotFound", f"subAgents names {', '.join(missing)}: no Agent "
                                     f"resource in namespace {namespace!r} and no built-in has that name")
            continue
        current = stored.get(name)
        try:
            if current is None:
                version = await definitions.create(namespace, name, spec)
            elif current.spec != spec:
                version = await definitions.update(namespace, name, spec)
            else:
                version = current.version
        except DefinitionRejected as exc:
            outcomes[name] = Outcome(False, "InvalidSpec", str(exc))
            continue
        outcomes[name] = Outcome(True, "Synced", f"agent {name!r} of namespace {namespace!r} is at version {version}",
                                 version)
    for name in sorted(set(stored) - names):
        await definitions.delete(namespace, name)
        log.info("agent removed with its resource", namespace=namespace, agent=name)
    return outcomes


# A pass over one namespace: its resources, the port it syncs them into; the outcome per resource.
Reconcile = Callable[[str, list[dict[str, Any]], Any], Awaitable[dict[str, Outcome]]]


class AgentController:
    """One list-and-watch loop per managed namespace, started and stopped with leadership. The
    same loop serves `ModelConfig` resources (model_resources.py) with its own `reconcile`."""

    def __init__(self, resources: AgentResources, definitions: Any, namespaces: tuple[str, ...],
                 resync_s: float, retry_s: float = 5.0, *, reconcile: Reconcile = reconcile_namespace,
                 kind: str = "agent"):
        self._resources = resources
        self._definitions = definitions
        self._namespaces = namespaces
        self._resync_s = resync_s
        self._retry_s = retry_s
        self._reconcile = reconcile
        self._kind = kind
        self._tasks: dict[str, asyncio.Task[None]] = {}

    @property
    def running(self) -> bool:
        return bool(self._tasks)

    def start(self) -> None:
        self._tasks = {ns: asyncio.create_task(self._run(ns), name=f"{self._kind}-resources-{ns}")
                       for ns in self._namespaces}

    def resync(self, namespace: str) -> None:
        """Relist the namespace and pass over it now (what its resources refer to changed)."""
        task = self._tasks.get(namespace)
        if task is not None:
            task.cancel()
            self._tasks[namespace] = asyncio.create_task(self._run(namespace), name=f"{self._kind}-resources-{namespace}")

    async def stop(self) -> None:
        tasks, self._tasks = list(self._tasks.values()), {}
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, namespace: str) -> None:
        while True:
            try:
                await self._list_and_watch(namespace)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the API or the gateway down: retry, never die
                log.warning(f"{self._kind} resources: pass failed; retrying", namespace=namespace,
                            error=str(exc)[:300])
                await asyncio.sleep(self._retry_s)

    async def _list_and_watch(self, namespace: str) -> None:
        items, version = await self._resources.list_resources(namespace)
        cache = {item["metadata"]["name"]: item for item in items}
        await self._pass(namespace, cache)
        # Closed on the way out (a resync cancels the loop), so the watch stops then, not at its timeout.
        async with contextlib.aclosing(self._resources.watch(namespace, version, self._resync_s)) as events:
            async for kind, obj in events:
                name = obj.get("metadata", {}).get("name", "")
                if kind == "DELETED":
                    cache.pop(name, None)
                elif kind in ("ADDED", "MODIFIED"):
                    cache[name] = obj
                else:
                    continue  # BOOKMARK
                await self._pass(namespace, cache)

    async def _pass(self, namespace: str, cache: dict[str, dict[str, Any]]) -> None:
        outcomes = await self._reconcile(namespace, list(cache.values()), self._definitions)
        for name, outcome in outcomes.items():
            resource = cache[name]
            status = status_of(resource, outcome)
            if not _same_status(resource, status):
                await self._resources.write_status(namespace, name, status)
                resource["status"] = status  # until the watch brings the written object back


async def run_controller_while_leading(controller: AgentController, is_leader: Callable[[], bool],
                                       check_s: float, stopping: asyncio.Event) -> None:
    """Runs the controller while this scheduler leads, stops it when leadership goes."""
    try:
        while not stopping.is_set():
            if is_leader() and not controller.running:
                log.info("resources: leading, watching")
                controller.start()
            elif not is_leader() and controller.running:
                await controller.stop()
            try:
                await asyncio.wait_for(stopping.wait(), check_s)
            except TimeoutError:
                pass
    finally:
        await controller.stop()
