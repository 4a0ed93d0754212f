"""Adapters of the agent controller (agent_controller.py): `Agent` resources through the official
`kubernetes` client (list, watch, and the status subresource: the calls rbac-calls.yaml lists),
and the namespace's agent definitions through the gateway's agent RPCs, under the scheduler's own
identity (the one caller the gateway lets change a managed namespace's agents).

The client is synchronous: a list or a status write runs in a worker thread; a watch streams in a
daemon thread of its own (it blocks until the server ends it, which must not hold up shutdown).
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any, AsyncGenerator, Callable

import grpc

from agentmesh.agent_manifest import (
    API_GROUP,
    API_VERSION,
    CONTROLLER_SUBJECT,
    GROUP_VERSION,
    KIND,
    ManifestError,
    document_of,
    spec_from_document,
)
from agentmesh.clients.gateway import GatewayClient
from agentmesh.rpc.auth import current_principal
from agentmesh.rpc.identity import Principal
from agentmesh.scheduler.agent_controller import DefinitionRejected, StoredAgent
from agentmesh.tenancy import encode_memberships
from agentmesh.v1 import agents_pb2, gateway_pb2

__all__ = ["ControllerCalls", "GatewayAgentDefinitions", "KubeAgentResources", "kubernetes_custom_objects_api"]

PLURAL = "agents"
_END = object()


class KubeAgentResources:
    """`plural`: agents, or modelconfigs (the ModelConfig controller, model_resources.py)."""

    def __init__(self, api: Any, plural: str = PLURAL):
        self._api = api  # kubernetes.client.CustomObjectsApi
        self._plural = plural

    async def list_resources(self, namespace: str) -> tuple[list[dict[str, Any]], str]:
        listed = await asyncio.to_thread(self._api.list_namespaced_custom_object, API_GROUP, GROUP_VERSION,
                                         namespace, self._plural)
        return list(listed.get("items") or []), str((listed.get("metadata") or {}).get("resourceVersion") or "")

    async def watch(self, namespace: str, resource_version: str,
                    timeout_s: float) -> AsyncGenerator[tuple[str, dict], None]:
        from kubernetes import watch

        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        stream = watch.Watch()

        def put(item: Any) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:
                stream.stop()  # the loop is closed: nobody listens any more

        def pump() -> None:
            try:
                for event in stream.stream(self._api.list_namespaced_custom_object, API_GROUP, GROUP_VERSION,
                                           namespace, self._plural, resource_version=resource_version,
                                           timeout_seconds=max(1, int(timeout_s))):
                    put((event["type"], event["object"]))
            except Exception as exc:  # noqa: BLE001 - handed to the async side, which retries
                put(exc)
            finally:
                put(_END)

        threading.Thread(target=pump, name=f"watch-{self._plural}-{namespace}", daemon=True).start()
        try:
            while (item := await queue.get()) is not _END:
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            stream.stop()

    async def write_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        await asyncio.to_thread(self._api.patch_namespaced_custom_object_status, API_GROUP, GROUP_VERSION,
                                namespace, self._plural, name, {"status": status})


class ControllerCalls:
    """The gateway's RPCs as a controller makes them. `owner_of`: the tenant owning a namespace under
    a tenant policy (None: no policy). No principal is in every tenant, so each call is signed for
    the scheduler as admin of the namespace's tenant — as the retention sweep's passes are
    (gateway/retention.py). `rejected`: what a refusal without details says."""

    rejected = "the gateway refused the spec"

    def __init__(self, gateway: GatewayClient, owner_of: Callable[[str], str | None] | None = None,
                 timeout_s: float = 30.0):
        self._stub = gateway.stub
        self._owner_of = owner_of
        self._timeout_s = timeout_s

    async def _call(self, method: str, request: Any, namespace: str) -> Any:
        tenant = self._owner_of(namespace) if self._owner_of is not None and namespace else None
        acting = current_principal.set(
            Principal(CONTROLLER_SUBJECT, encode_memberships({tenant: "admin"})) if tenant else None)
        try:
            return await getattr(self._stub, method)(request, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise DefinitionRejected(err.details() or self.rejected) from None
            raise
        finally:
            current_principal.reset(acting)


class GatewayAgentDefinitions(ControllerCalls):
    """The namespace's agent definitions through the gateway, signed as ControllerCalls says."""

    @staticmethod
    def _proto(name: str, spec: dict[str, Any]) -> agents_pb2.AgentSpec:
        try:
            return spec_from_document({"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name},
                                       "spec": spec})[1]
        except ManifestError as exc:
            raise DefinitionRejected(f"{exc} (field {exc.field})") from None

    def canonical(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        proto = self._proto(name, spec)
        proto.description = " ".join(proto.description.split())  # as the memory service stores it
        return document_of(agents_pb2.AgentInfo(spec=proto))["spec"]

    async def agents(self, namespace: str) -> list[StoredAgent]:
        listed = await self._call("ListAgents", agents_pb2.ListAgentsRequest(namespace=namespace), namespace)
        return [StoredAgent(a.spec.name, a.current_version or a.version, a.builtin, document_of(a)["spec"])
                for a in listed.agents]

    async def models(self, namespace: str) -> list[str]:
        listed = await self._call("ListModels", gateway_pb2.ListModelsRequest(namespace=namespace), namespace)
        return [m.name for m in listed.models]

    async def create(self, namespace: str, name: str, spec: dict[str, Any]) -> int:
        info = await self._call("CreateAgent", agents_pb2.CreateAgentRequest(namespace=namespace,
                                                                             spec=self._proto(name, spec)), namespace)
        return info.current_version or info.version

    async def update(self, namespace: str, name: str, spec: dict[str, Any]) -> int:
        info = await self._call("UpdateAgent", agents_pb2.UpdateAgentRequest(namespace=namespace,
                                                                             spec=self._proto(name, spec)), namespace)
        return info.current_version or info.version

    async def delete(self, namespace: str, name: str) -> None:
        await self._call("DeleteAgent", agents_pb2.DeleteAgentRequest(namespace=namespace, name=name), namespace)


def kubernetes_custom_objects_api() -> Any:
    """A CustomObjectsApi from the pod's service account, or ~/.kube/config (KUBECONFIG) outside a pod."""
    from kubernetes import client, config

    from agentmesh.config import ConfigError

    # A client of its own, not the library's process-wide default (which keeps the first one made).
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        try:
            # KUBECONFIG as it is now (the library reads it once, at import).
            config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None,
                                    client_configuration=configuration)
        except (config.ConfigException, OSError) as exc:
            raise ConfigError(
                "AGENTMESH_MANAGED_AGENT_NAMESPACES needs the Kubernetes API: run in a pod with a service account "
                f"token, or point KUBECONFIG at a cluster ({exc})"
            ) from None
    return client.CustomObjectsApi(client.ApiClient(configuration))
