"""The narrow adapter between the Kubernetes executor and the API server.

Every call the tools service makes to Kubernetes is a method here, and each maps to exactly one
verb the sandbox Role grants in its namespace:

    create_job   POST   /apis/batch/v1/namespaces/{ns}/jobs                  jobs: create
    get_job      GET    /apis/batch/v1/namespaces/{ns}/jobs/{name}           jobs: get
    delete_job   DELETE /apis/batch/v1/namespaces/{ns}/jobs/{name}           jobs: delete (Background)
    list_pods    GET    /api/v1/namespaces/{ns}/pods?labelSelector=          pods: list
    watch_pods   GET    /api/v1/namespaces/{ns}/pods?labelSelector=&watch=1  pods: watch
    pod_log      GET    /api/v1/namespaces/{ns}/pods/{name}/log              pods/log: get

and for stdio MCP servers run as long-lived pods (agentmesh.tools.mcp.pod_opener):

    create_pod   POST   /api/v1/namespaces/{ns}/pods                         pods: create
    get_pod      GET    /api/v1/namespaces/{ns}/pods/{name}                  pods: get
    delete_pod   DELETE /api/v1/namespaces/{ns}/pods/{name}                  pods: delete
    attach       GET    /api/v1/namespaces/{ns}/pods/{name}/attach (websocket) pods/attach: get, create

and for session pods and their warm pool (k8s_session.py, k8s_pool.py):

    patch_pod    PATCH  /api/v1/namespaces/{ns}/pods/{name} (merge patch)    pods: patch
    exec         GET    /api/v1/namespaces/{ns}/pods/{name}/exec (websocket)   pods/exec: get, create

and, where a template's session sandboxes are agent-sandbox's (agent_sandbox.py), its claims
(group extensions.agents.x-k8s.io) and the Sandbox a claim is bound to (agents.x-k8s.io):

    create_claim POST   .../sandboxclaims                                    sandboxclaims: create
    list_claims  GET    .../sandboxclaims?labelSelector=                     sandboxclaims: list
    watch_claims GET    .../sandboxclaims?labelSelector=&watch=1             sandboxclaims: watch
    delete_claim DELETE .../sandboxclaims/{name}                             sandboxclaims: delete
    get_sandbox  GET    .../sandboxes/{name}                                 sandboxes: get

The official `kubernetes` client is synchronous; its calls run on a thread pool of our own (so
long watches never starve the default executor the file tools use). Failures on the way (no
connection, 429, 5xx) are retried with exponential backoff and jitter, explicitly, here and
nowhere else; other statuses become `KubeApiError` at once.
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Callable

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import ws_client
from kubernetes.stream.stream import _websocket_request
from kubernetes.stream.ws_client import WSClient

from agentmesh.logs import get_logger

log = get_logger("agentmesh.tools.kubernetes")

RETRYABLE_STATUS = {429, 500, 502, 503, 504}
# The client's `stream()` is this partial with `websocket_call` as it is; ours does not keep a copy of
# everything the other end writes (`capture_all`), which for a connection of hours only grows.
_stream_uncaptured = functools.partial(_websocket_request, functools.partial(ws_client.websocket_call, capture_all=False), None)
# The websocket client reports a refused upgrade only in words ("Handshake status 403 Forbidden ...").
_HANDSHAKE_STATUS = re.compile(r"Handshake status (\d{3})")


class KubeApiError(Exception):
    def __init__(self, status: int, reason: str, message: str):
        super().__init__(f"Kubernetes API error {status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


def _api_error(exc: ApiException) -> KubeApiError:
    message = exc.reason or ""
    try:
        body = json.loads(exc.body or "{}")
        message = body.get("message", message)
    except (ValueError, AttributeError):
        pass
    return KubeApiError(exc.status or 0, exc.reason or "", message)


class KubernetesJobs:
    def __init__(self, api_client: client.ApiClient, namespace: str, *, retries: int = 4, backoff_s: float = 0.2, threads: int = 64):
        self._api_client = api_client
        self._batch = client.BatchV1Api(api_client)
        self._core = client.CoreV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self.namespace = namespace
        self._retries = retries
        self._backoff_s = backoff_s
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kube-api")

    async def _call(self, what: str, fn: Callable[[], Any], *, idempotent: bool = True) -> Any:
        loop = asyncio.get_running_loop()
        attempt = 0
        while True:
            try:
                return await loop.run_in_executor(self._pool, fn)
            except ApiException as exc:
                retry = exc.status in RETRYABLE_STATUS
                error: Exception = _api_error(exc)
                retry_after = _retry_after(exc)
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                # No answer at all: safe to repeat for idempotent calls; creates carry a unique
                # name, so a repeated create answers 409 and the caller treats that as done.
                retry, error, retry_after = True, exc, None
            if not retry or attempt >= self._retries:
                raise error
            delay = retry_after if retry_after is not None else self._backoff_s * (2**attempt) * (0.5 + random.random())
            log.warning("kubernetes API call failed; retrying", call=what, attempt=attempt + 1, error=str(error), delay_s=round(delay, 2))
            attempt += 1
            await asyncio.sleep(delay)

    @staticmethod
    def _json(response: Any) -> dict[str, Any]:
        return json.loads(response.data or b"{}")

    async def create_job(self, body: dict[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        try:
            response = await self._call(
                "create_job",
                lambda: self._batch.create_namespaced_job(self.namespace, body, _preload_content=False),  # type: ignore[arg-type]  # a manifest dict is accepted
            )
        except KubeApiError as exc:
            if exc.status == 409:
                # An earlier attempt whose answer was lost created it (names are unique per call).
                existing = await self.get_job(name)
                if existing is not None:
                    return existing
            raise
        return self._json(response)

    async def get_job(self, name: str) -> dict[str, Any] | None:
        try:
            response = await self._call("get_job", lambda: self._batch.read_namespaced_job(name, self.namespace, _preload_content=False))
        except KubeApiError as exc:
            if exc.status == 404:
                return None
            raise
        return self._json(response)

    async def delete_job(self, name: str) -> bool:
        """Delete the Job and (in the background, by the garbage collector) its pods; False if already gone."""
        try:
            await self._call(
                "delete_job",
                lambda: self._batch.delete_namespaced_job(
                    name, self.namespace, propagation_policy="Background", grace_period_seconds=0, _preload_content=False
                ),
            )
        except KubeApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def list_pods(self, selector: str) -> tuple[list[dict[str, Any]], str]:
        response = await self._call(
            "list_pods", lambda: self._core.list_namespaced_pod(self.namespace, label_selector=selector, _preload_content=False)
        )
        body = self._json(response)
        return body.get("items", []), body.get("metadata", {}).get("resourceVersion", "")

    async def watch_pods(self, selector: str, resource_version: str, timeout_s: int) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(type, pod) events after `resource_version` until the server ends the watch."""
        def request() -> Any:
            return self._core.list_namespaced_pod(
                self.namespace, label_selector=selector, watch=True, resource_version=resource_version or None,
                allow_watch_bookmarks=True, timeout_seconds=timeout_s, _preload_content=False,
                _request_timeout=(10, timeout_s + 10))

        async for event in self._watch("watch_pods", request):
            yield event

    async def _watch(self, what: str, request: Callable[[], Any]) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(type, object) events of the watch `request` opens, until the server ends it.

        The HTTP response is closed from here when the consumer stops early (a cancelled call), which
        unblocks the reading thread at once.
        """
        loop = asyncio.get_running_loop()
        response = await self._call(what, request)
        queue: asyncio.Queue = asyncio.Queue()

        def pump() -> None:
            buffer = b""
            try:
                for chunk in response.stream(8192, decode_content=True):
                    buffer += chunk
                    while b"\n" in buffer:
                        line, buffer = buffer.split(b"\n", 1)
                        if line.strip():
                            loop.call_soon_threadsafe(queue.put_nowait, json.loads(line))
            except Exception as exc:  # noqa: BLE001 - ends the watch; the caller re-lists
                loop.call_soon_threadsafe(queue.put_nowait, exc)
            finally:
                loop.call_soon_threadsafe(queue.put_nowait, None)

        reader = loop.run_in_executor(self._pool, pump)
        try:
            while True:
                item = await queue.get()
                if item is None:
                    return
                if isinstance(item, Exception):
                    log.info("watch ended early", call=what, error=str(item))
                    return
                if item.get("type") == "ERROR":
                    # 410 Gone: our resourceVersion is too old; the caller re-lists.
                    return
                yield item["type"], item["object"]
        finally:
            # Unblocks the reading thread if it still waits for the next event (it then ends on
            # its own; nothing awaits it), and closes the connection instead of pooling it: a
            # watch stream ended early is half read, and a half-read connection handed to the
            # next request fails it.
            if not reader.done():
                response.shutdown()
            response.close()

    async def pod_log(self, pod: str, container: str, limit_bytes: int) -> str:
        response = await self._call(
            "pod_log",
            lambda: self._core.read_namespaced_pod_log(
                pod, self.namespace, container=container, limit_bytes=limit_bytes, _preload_content=False
            ),
        )
        return (response.data or b"").decode("utf-8", errors="replace")

    async def create_pod(self, body: dict[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        try:
            response = await self._call(
                "create_pod",
                lambda: self._core.create_namespaced_pod(self.namespace, body, _preload_content=False),  # type: ignore[arg-type]  # a manifest dict is accepted
            )
        except KubeApiError as exc:
            if exc.status == 409:
                existing = await self.get_pod(name)  # an earlier attempt whose answer was lost
                if existing is not None:
                    return existing
            raise
        return self._json(response)

    async def get_pod(self, name: str) -> dict[str, Any] | None:
        try:
            response = await self._call("get_pod", lambda: self._core.read_namespaced_pod(name, self.namespace, _preload_content=False))
        except KubeApiError as exc:
            if exc.status == 404:
                return None
            raise
        return self._json(response)

    async def delete_pod(self, name: str) -> bool:
        """Delete the pod at once (no grace period); False if it was already gone."""
        try:
            await self._call(
                "delete_pod",
                lambda: self._core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0, _preload_content=False),
            )
        except KubeApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def attach(self, pod: str, container: str) -> WSClient:
        """A websocket attached to the container's stdin, stdout and stderr (the v5/v4 channel protocol)."""
        return await self._websocket("attach", lambda api: api.connect_get_namespaced_pod_attach, pod, container=container)

    async def patch_pod(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """A JSON merge patch. With `metadata.resourceVersion` in it the API server applies it only
        to that version of the pod (409 Conflict otherwise): optimistic concurrency, how a warm
        pod is claimed by one tools replica and never two. Not retried on 409."""
        response = await self._call(
            "patch_pod",
            lambda: self._core.patch_namespaced_pod(name, self.namespace, patch, _preload_content=False,
                                                    _content_type="application/merge-patch+json"),
        )
        return self._json(response)

    async def exec(self, pod: str, container: str, command: list[str]) -> WSClient:
        """A websocket to a new process `command` in the pod's container (pods/exec; the v5/v4
        channel protocol): 0 its stdin, 1 stdout, 2 stderr, 3 the API server's Status when it ends."""
        return await self._websocket("exec", lambda api: api.connect_get_namespaced_pod_exec, pod, command=command,
                                     container=container)

    async def _websocket(self, what: str, method: Callable[[client.CoreV1Api], Callable[..., Any]], pod: str,
                         **params: Any) -> WSClient:
        """A channel websocket to the pod (`method` of the core API: pods/attach or pods/exec), with
        stdin, stdout and stderr; a refused handshake raises the API server's status.

        `stream()` swaps the API client's request method for the duration of the call, so it gets an
        ApiClient of its own: requests other threads make on the shared one meanwhile stay plain HTTP.
        """
        def connect() -> WSClient:
            own = client.ApiClient(self._api_client.configuration)
            try:
                socket: WSClient = _stream_uncaptured(
                    method(client.CoreV1Api(own)), pod, self.namespace, **params,
                    stdin=True, stdout=True, stderr=True, tty=False, binary=True, _preload_content=False,
                )
                return socket
            finally:
                own.close()  # its pool only: the websocket has a socket of its own

        try:
            socket: WSClient = await self._call(what, connect)
        except KubeApiError as exc:
            refused = _HANDSHAKE_STATUS.search(exc.message or exc.reason)
            if exc.status == 0 and refused:
                raise KubeApiError(int(refused.group(1)), "", exc.reason) from None
            raise
        return socket

    # --- agent-sandbox's claims (agent_sandbox.py) -------------------------------------------------

    async def create_claim(self, body: dict[str, Any]) -> dict[str, Any]:
        group, version = _group_version(body["apiVersion"])
        try:
            response = await self._call("create_claim", lambda: self._custom.create_namespaced_custom_object(
                group, version, self.namespace, "sandboxclaims", body, _preload_content=False))
        except KubeApiError as exc:
            if exc.status == 409:
                return body  # an earlier attempt whose answer was lost made it (names are unique per claim)
            raise
        return self._json(response)

    async def list_claims(self, api_version: str, selector: str) -> tuple[list[dict[str, Any]], str]:
        group, version = _group_version(api_version)
        response = await self._call("list_claims", lambda: self._custom.list_namespaced_custom_object(
            group, version, self.namespace, "sandboxclaims", label_selector=selector, _preload_content=False))
        body = self._json(response)
        return body.get("items", []), body.get("metadata", {}).get("resourceVersion", "")

    async def watch_claims(self, api_version: str, selector: str, resource_version: str,
                           timeout_s: int) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        group, version = _group_version(api_version)

        def request() -> Any:
            return self._custom.list_namespaced_custom_object(
                group, version, self.namespace, "sandboxclaims", label_selector=selector, watch=True,
                resource_version=resource_version or None, allow_watch_bookmarks=True, timeout_seconds=timeout_s,
                _preload_content=False, _request_timeout=(10, timeout_s + 10))

        async for event in self._watch("watch_claims", request):
            yield event

    async def delete_claim(self, api_version: str, name: str) -> bool:
        """Delete the claim (agent-sandbox's controller then deletes its Sandbox and pod); False if gone."""
        group, version = _group_version(api_version)
        try:
            await self._call("delete_claim", lambda: self._custom.delete_namespaced_custom_object(
                group, version, self.namespace, "sandboxclaims", name, propagation_policy="Background",
                _preload_content=False))
        except KubeApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def get_sandbox(self, api_version: str, name: str) -> dict[str, Any] | None:
        group, version = _group_version(api_version)
        try:
            response = await self._call("get_sandbox", lambda: self._custom.get_namespaced_custom_object(
                group, version, self.namespace, "sandboxes", name, _preload_content=False))
        except KubeApiError as exc:
            if exc.status == 404:
                return None
            raise
        return self._json(response)

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        await asyncio.to_thread(self._api_client.close)


def _retry_after(exc: ApiException) -> float | None:
    headers = exc.headers or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        return min(float(value), 10.0) if value else None
    except ValueError:
        return None


def _group_version(api_version: str) -> tuple[str, str]:
    group, _, version = api_version.partition("/")
    return group, version
