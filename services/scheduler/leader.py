"""Leader election: only the leader fires schedules. A file lock on one machine, a Kubernetes
Lease (coordination.k8s.io/v1) in a cluster.

The store's idempotent claim is the safety net; the lock is what keeps a second replica from
even trying. Both locks are polled by the engine every `renew_s`: `acquire()` means "become
or stay leader", and returns whether we are leader now.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from agentmesh.logs import get_logger

log = get_logger("agentmesh.scheduler.leader")


class FileLeaderLock:
    """An OS file lock (flock): released by the kernel when the holder dies, so no expiry logic."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = FileLock(str(path), timeout=0, thread_local=False)

    async def acquire(self, now: float) -> bool:
        if self._lock.is_locked:
            return True
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            return False
        return True

    async def release(self) -> None:
        if self._lock.is_locked:
            self._lock.release(force=True)


def _micro_time(ts: float) -> datetime:
    """A time for a MicroTime field. The API server parses those with exactly six fractional
    digits, but the client serialises with isoformat(), which drops them at .000000 — so a
    whole second is nudged by one microsecond."""
    when = datetime.fromtimestamp(ts, UTC)
    return when.replace(microsecond=1) if when.microsecond == 0 else when


class LeaseLeaderLock:
    """A coordination.k8s.io/v1 Lease, using only get, create and update (the chart's RBAC).

    Expiry is judged the way client-go does: a lease whose record has not changed for
    `duration_s` of *our own* observation is free, so clock skew between nodes does not matter.
    Conflicts (HTTP 409) mean another replica won the race; we simply are not leader this round.
    """

    def __init__(self, api: Any, namespace: str, name: str, identity: str, duration_s: float):
        self._api = api  # kubernetes.client.CoordinationV1Api
        self._namespace = namespace
        self._name = name
        self._identity = identity
        self._duration_s = duration_s
        self._observed: tuple[str, float] | None = None  # (resourceVersion, when we first saw it)
        self._held = False

    async def acquire(self, now: float) -> bool:
        try:
            self._held = await asyncio.to_thread(self._acquire, now)
        except Exception as exc:  # noqa: BLE001 - the API being down must not kill the loop
            log.warning("lease request failed", lease=self._name, error=str(exc)[:300])
            self._held = False
        return self._held

    def _body(self, now: float, resource_version: str | None, acquired_at: float, transitions: int,
              holder: str, duration_s: int) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self._name, "namespace": self._namespace}
        if resource_version:
            metadata["resourceVersion"] = resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": duration_s,
                "acquireTime": _micro_time(acquired_at),
                "renewTime": _micro_time(now),
                "leaseTransitions": transitions,
            },
        }

    def _acquire(self, now: float) -> bool:
        from kubernetes.client.exceptions import ApiException

        duration = max(1, round(self._duration_s))
        try:
            lease = self._api.read_namespaced_lease(self._name, self._namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            try:
                self._api.create_namespaced_lease(
                    self._namespace, self._body(now, None, now, 0, self._identity, duration)
                )
            except ApiException as create_exc:
                if create_exc.status == 409:
                    return False
                raise
            log.info("leadership acquired", lease=self._name, created=True)
            return True

        spec = lease.spec
        version = lease.metadata.resource_version
        holder = spec.holder_identity or ""
        if holder != self._identity:
            if self._observed is None or self._observed[0] != version:
                self._observed = (version, now)
            held_for = spec.lease_duration_seconds or duration
            if holder and now - self._observed[1] < held_for:
                return False  # someone else holds it and has renewed within its duration
        acquired_at = spec.acquire_time.timestamp() if holder == self._identity and spec.acquire_time else now
        transitions = (spec.lease_transitions or 0) + (0 if holder == self._identity else 1)
        try:
            self._api.replace_namespaced_lease(
                self._name, self._namespace, self._body(now, version, acquired_at, transitions, self._identity, duration)
            )
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        if holder != self._identity:
            log.info("leadership acquired", lease=self._name, previous_holder=holder or None)
        return True

    async def release(self) -> None:
        """Hand the lease back (empty holder, 1 s duration) so a standby takes over at once."""
        if not self._held:
            return
        self._held = False
        try:
            await asyncio.to_thread(self._release)
        except Exception as exc:  # noqa: BLE001 - best effort; the lease expires anyway
            log.warning("lease release failed", lease=self._name, error=str(exc)[:300])

    def _release(self) -> None:
        import time

        lease = self._api.read_namespaced_lease(self._name, self._namespace)
        if (lease.spec.holder_identity or "") != self._identity:
            return
        acquired = lease.spec.acquire_time.timestamp() if lease.spec.acquire_time else time.time()
        body = self._body(time.time(), lease.metadata.resource_version, acquired, lease.spec.lease_transitions or 0, "", 1)
        self._api.replace_namespaced_lease(self._name, self._namespace, body)


def kubernetes_lease_api() -> Any:
    """A CoordinationV1Api from the pod's service account, or ~/.kube/config outside a pod."""
    from kubernetes import client, config

    from agentmesh.config import ConfigError

    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config()
        except (config.ConfigException, OSError) as exc:
            raise ConfigError(
                "AGENTMESH_SCHEDULER_LOCK=lease needs the Kubernetes API: run in a pod with a service account "
                f"token, or point KUBECONFIG at a cluster ({exc})"
            ) from None
    return client.CoordinationV1Api()
