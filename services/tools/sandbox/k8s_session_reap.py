"""Session pods across tools replicas: when a pod was last used, and removing the ones no replica uses.

Each replica knows the pods it started or claimed, and reaps them when it has not used them for
the idle time. Two things that knowledge misses: a pod another replica is using as well (two
replicas serving one session), and a pod whose replica went away (a crash, a scale-down). So a
replica writes the wall-clock time it last used each of its pods into the pod's
`agentmesh.io/last-used` annotation (at most every quarter of the idle time per pod, and while a
call is still running), lets go of its own idle pod without deleting it when that annotation
says another replica used it since (and within the idle time), and deletes any session pod whose annotation (or creation, without one) is older than
twice the idle time.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from agentmesh.logs import get_logger
from agentmesh.tools.sandbox.k8s_api import KubeApiError, KubernetesJobs
from agentmesh.tools.sandbox.k8s_session_pod import LABEL_POOL, SESSION_PODS

__all__ = ["ANNOTATION_LAST_USED", "last_used", "mark_used", "sweep_abandoned"]

log = get_logger("agentmesh.tools.kubernetes.session")

ANNOTATION_LAST_USED = "agentmesh.io/last-used"
# Session pods (not the pool's warm ones): a pod with no pool label is a cold session pod.
IN_USE = f"{SESSION_PODS},{LABEL_POOL}!=warm"


def last_used(pod: dict[str, Any]) -> float:
    """Wall-clock seconds of the pod's last use any replica wrote (its creation without one)."""
    meta = pod.get("metadata") or {}
    stamp = (meta.get("annotations") or {}).get(ANNOTATION_LAST_USED, "")
    try:
        return float(stamp)
    except ValueError:
        pass
    try:
        return datetime.strptime(meta.get("creationTimestamp", ""), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return time.time()


async def mark_used(api: KubernetesJobs, name: str, stamp: float) -> None:
    """Write `stamp` (wall-clock seconds of the replica's last use) into the pod."""
    try:
        await api.patch_pod(name, {"metadata": {"annotations": {ANNOTATION_LAST_USED: f"{stamp:.3f}"}}})
    except KubeApiError as exc:
        if exc.status != 404:
            log.info("could not mark a session pod used", pod=name, error=str(exc))


async def sweep_abandoned(api: KubernetesJobs, own: set[str], idle_s: float) -> list[str]:
    """Delete session pods no replica has used for twice the idle time; their names."""
    pods, _ = await api.list_pods(IN_USE)
    now = time.time()
    deleted = []
    for pod in pods:
        name = pod["metadata"]["name"]
        if name in own or pod["metadata"].get("deletionTimestamp") or now - last_used(pod) < 2 * idle_s:
            continue
        try:
            await api.delete_pod(name)
        except KubeApiError as exc:
            log.info("could not delete an abandoned session pod", pod=name, error=str(exc))
            continue
        deleted.append(name)
        log.info("abandoned session pod deleted", pod=name)
    return deleted
