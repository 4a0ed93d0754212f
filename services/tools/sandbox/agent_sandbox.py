"""Session sandboxes from a cluster's agent-sandbox (kubernetes-sigs/agent-sandbox): a template
with `agent_sandbox_pool: NAME` gets its session pods by SandboxClaims on the SandboxWarmPool
NAME instead of making pods and keeping a warm pool of its own (k8s_session.py, k8s_pool.py).

A session's first call creates a SandboxClaim (extensions.agents.x-k8s.io/v1beta1) labelled with
its owner (tenant, namespace, session) and `spec.warmPoolRef` naming the pool; the same labels go
on the pod through `spec.additionalPodMetadata`. agent-sandbox's controller binds the claim to a
Sandbox (one of the pool's warm ones, or a new one) and mirrors the Sandbox's `Ready` condition
into the claim's status, with the Sandbox's name in `status.sandbox.name`. The pod is the
Sandbox's `agents.x-k8s.io/pod-name` annotation (a pod adopted from the warm pool) or, without
it, the Sandbox's own name. From there the session is served as one of our own session pods:
the same supervisor through the same `pods/exec` stream (k8s_supervisor.py), in the pod's first
container. Ending the session, or its idle time passing, deletes the claim; agent-sandbox then
deletes the Sandbox and its pod.

A claim that is not Ready within the start timeout is deleted and the call says why, in the
claim's own words (its Ready condition's reason and message); one whose condition says it can
never be (no such pool, invalid metadata) is given up at once.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentmesh.logs import get_logger
from agentmesh.tools.sandbox.k8s_api import KubeApiError, KubernetesJobs
from agentmesh.tools.sandbox.k8s_job import COMPONENT_LABELS, LABEL_SESSION, label_value
from agentmesh.tools.sandbox.k8s_session_pod import LABEL_COMPONENT, LABEL_TEMPLATE
from agentmesh.tools.sandbox.k8s_session_reap import last_used
from agentmesh.tools.sandbox.k8s_session_start import PodStartFailed, pod_error

__all__ = [
    "CLAIM_API_VERSION",
    "LABEL_CLAIM",
    "LABEL_NAMESPACE",
    "LABEL_TENANT",
    "POD_NAME_ANNOTATION",
    "SANDBOX_API_VERSION",
    "ClaimedPod",
    "SandboxClaims",
    "claim_body",
]

log = get_logger("agentmesh.tools.kubernetes.session")

CLAIM_API_VERSION = "extensions.agents.x-k8s.io/v1beta1"
SANDBOX_API_VERSION = "agents.x-k8s.io/v1beta1"
POD_NAME_ANNOTATION = "agents.x-k8s.io/pod-name"
LABEL_CLAIM = "agentmesh.io/claim"
LABEL_TENANT = "agentmesh.io/tenant"
LABEL_NAMESPACE = "agentmesh.io/namespace"
ANNOTATION_SESSION = "agentmesh.io/session-id"
COMPONENT = "session-claim"
CLAIMS = f"{LABEL_COMPONENT}={COMPONENT},app.kubernetes.io/managed-by={COMPONENT_LABELS['app.kubernetes.io/managed-by']}"
# Ready=False reasons of agent-sandbox's claim controller that waiting does not change.
FINAL_REASONS = {"WarmPoolNotFound", "TemplateNotFound", "InvalidMetadata", "EnvVarsInjectionRejected",
                 "VolumeClaimTemplatesError", "ClaimExpired", "SandboxExpired"}
WATCH_WINDOW_S = 30
# A Ready claim whose Sandbox or pod this replica cannot read yet (its cache behind the
# controller's): looked at again after this long, not at the claim's next event (there may be none).
RESOLVE_AGAIN_S = 0.2


@dataclass(frozen=True)
class ClaimedPod:
    claim: str
    pod: str
    container: str


def claim_body(name: str, pool: str, template: str, session_id: str, tenant: str = "",
               namespace: str = "") -> dict[str, Any]:
    """The SandboxClaim of one session: on the claim and (additionalPodMetadata) on its pod, who owns it."""
    owner = {LABEL_SESSION: label_value(session_id), LABEL_CLAIM: name}
    if tenant:
        owner[LABEL_TENANT] = label_value(tenant)
    if namespace:
        owner[LABEL_NAMESPACE] = label_value(namespace)
    labels = {**COMPONENT_LABELS, LABEL_COMPONENT: COMPONENT, LABEL_TEMPLATE: label_value(template), **owner}
    return {
        "apiVersion": CLAIM_API_VERSION, "kind": "SandboxClaim",
        "metadata": {"name": name, "labels": labels, "annotations": {ANNOTATION_SESSION: session_id}},
        "spec": {"warmPoolRef": {"name": pool},
                 "additionalPodMetadata": {"labels": owner, "annotations": {ANNOTATION_SESSION: session_id}}},
    }


def _ready(claim: dict[str, Any]) -> dict[str, Any]:
    """The claim's Ready condition ({} before the controller wrote one)."""
    for condition in (claim.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return dict(condition)
    return {}


class SandboxClaims:
    """The claims of one template's session sandboxes, on the SandboxWarmPool `pool`."""

    def __init__(self, api: KubernetesJobs, pool: str, template: str, timeout_s: float):
        self._api = api
        self.pool = pool
        self._template = template
        self._timeout_s = timeout_s
        # Claims this replica has created and not yet handed over as a session's (a Ready wait can be
        # longer than the sweep's age): the sweep never takes them for a dead replica's.
        self._making: set[str] = set()

    async def claim(self, session_id: str, tenant: str = "", namespace: str = "") -> ClaimedPod:
        """A Ready claim's pod for the session; PodStartFailed (the claim deleted) says why not."""
        name = f"agentmesh-claim-{uuid.uuid4().hex[:16]}"
        body = claim_body(name, self.pool, self._template, session_id, tenant, namespace)
        self._making.add(name)
        try:
            try:
                await self._api.create_claim(body)
            except KubeApiError as exc:
                raise PodStartFailed(pod_error("sandbox_unavailable", self._refused(exc))) from None
            try:
                claimed = await self._until_ready(name)
            except BaseException:
                await self.release(name)
                raise
        finally:
            self._making.discard(name)
        log.info("session sandbox claimed from agent-sandbox", session_id=session_id, claim=name, pod=claimed.pod,
                 pool=self.pool)
        return claimed

    def _refused(self, exc: KubeApiError) -> str:
        where = f"in namespace {self._api.namespace}"
        if exc.status == 404:
            return (f"the cluster does not serve SandboxClaims ({CLAIM_API_VERSION}) {where}: install agent-sandbox "
                    f"with its extensions, or take agent_sandbox_pool out of sandbox template {self._template!r}")
        if exc.status in (401, 403):
            return (f"the Kubernetes API refused the tools service ({exc.status}): {exc.message}. With agent-sandbox "
                    f"session sandboxes its service account needs create/list/watch/delete on sandboxclaims "
                    f"({CLAIM_API_VERSION.split('/')[0]}) and get on sandboxes ({SANDBOX_API_VERSION.split('/')[0]}) "
                    f"{where} (the chart grants them when a template sets agentSandboxPool)")
        return f"agent-sandbox's SandboxClaim could not be created ({exc.status}): {exc.message}"

    async def _until_ready(self, name: str) -> ClaimedPod:
        selector = f"{LABEL_CLAIM}={name}"
        last: dict[str, Any] = {}
        try:
            async with asyncio.timeout(self._timeout_s):
                while True:
                    claims, version = await self._api.list_claims(CLAIM_API_VERSION, selector)
                    if not claims:
                        raise PodStartFailed(pod_error("sandbox_error", f"the session's SandboxClaim {name} was deleted "
                                                                        "before its sandbox was ready"))
                    last = claims[0]
                    if (claimed := await self._judge(name, last)) is not None:
                        return claimed
                    if _ready(last).get("status") == "True":
                        await asyncio.sleep(RESOLVE_AGAIN_S)
                        continue
                    async for event, claim in self._api.watch_claims(CLAIM_API_VERSION, selector, version,
                                                                     WATCH_WINDOW_S):
                        if event == "DELETED":
                            raise PodStartFailed(pod_error("sandbox_error", f"the session's SandboxClaim {name} was "
                                                                            "deleted before its sandbox was ready"))
                        if event in ("ADDED", "MODIFIED"):
                            last = claim
                            if (claimed := await self._judge(name, claim)) is not None:
                                return claimed
                            if _ready(claim).get("status") == "True":
                                break  # Ready, its pod not readable yet: list again (above)
        except TimeoutError:
            ready = _ready(last)
            said = f"{ready.get('reason')}: {ready.get('message')}" if ready.get("reason") else "no Ready condition yet"
            raise PodStartFailed(pod_error("start_timeout", (
                f"agent-sandbox did not make the session's sandbox ready within {self._timeout_s:g} s (SandboxClaim "
                f"{name} on SandboxWarmPool {self.pool!r} in namespace {self._api.namespace}: {said}); the claim is "
                "deleted, the next call tries again"))) from None

    async def _judge(self, name: str, claim: dict[str, Any]) -> ClaimedPod | None:
        """The claimed pod once the claim is Ready; None while it is not; PodStartFailed when it cannot be."""
        ready = _ready(claim)
        if ready.get("status") != "True":
            if ready.get("reason") in FINAL_REASONS:
                raise PodStartFailed(pod_error("sandbox_error", (
                    f"agent-sandbox cannot give the session a sandbox: its SandboxClaim {name} says "
                    f"{ready['reason']}: {ready.get('message', '')} (sandbox template {self._template!r} names "
                    f"SandboxWarmPool {self.pool!r} in namespace {self._api.namespace})")))
            return None
        sandbox_name = ((claim.get("status") or {}).get("sandbox") or {}).get("name", "")
        sandbox = await self._api.get_sandbox(SANDBOX_API_VERSION, sandbox_name) if sandbox_name else None
        if sandbox is None:
            return None  # Ready before the Sandbox is readable: looked at again
        annotations = (sandbox.get("metadata") or {}).get("annotations") or {}
        pod_name = annotations.get(POD_NAME_ANNOTATION) or sandbox_name
        pod = await self._api.get_pod(pod_name)
        containers = ((pod or {}).get("spec") or {}).get("containers") or []
        if pod is None or not containers or (pod.get("status") or {}).get("phase") != "Running":
            return None
        return ClaimedPod(name, pod_name, containers[0]["name"])

    async def release(self, name: str) -> None:
        """Delete the claim (agent-sandbox deletes its Sandbox and pod); a failure is logged, the sweep retries."""
        deletion = asyncio.ensure_future(self._api.delete_claim(CLAIM_API_VERSION, name))
        try:
            await asyncio.shield(deletion)
        except asyncio.CancelledError:
            await asyncio.wait({deletion}, timeout=10)
            raise
        except Exception as exc:  # noqa: BLE001 - the next sweep or a person removes it; say so
            log.warning("could not delete a SandboxClaim", claim=name, error=str(exc))

    async def sweep(self, own: Callable[[], set[str]], idle_s: float) -> list[str]:
        """Delete this template's claims no replica has used for twice the idle time (their pod's
        `agentmesh.io/last-used`, else the claim's creation): a crashed or scaled-down replica's.
        `own`: the claims this replica's sessions hold, asked again at each claim (one may be handed
        over while the sweep awaits the API)."""
        claims, _ = await self._api.list_claims(CLAIM_API_VERSION, f"{CLAIMS},{LABEL_TEMPLATE}={label_value(self._template)}")
        now = time.time()
        deleted = []
        for claim in claims:
            meta = claim.get("metadata") or {}
            if meta.get("name") in own() or meta.get("name") in self._making or meta.get("deletionTimestamp"):
                continue
            used = last_used(claim)
            sandbox_name = ((claim.get("status") or {}).get("sandbox") or {}).get("name", "")
            sandbox = await self._api.get_sandbox(SANDBOX_API_VERSION, sandbox_name) if sandbox_name else None
            if sandbox is not None:
                pod_name = ((sandbox.get("metadata") or {}).get("annotations") or {}).get(POD_NAME_ANNOTATION)
                pod = await self._api.get_pod(pod_name or sandbox_name)
                used = max(used, last_used(pod)) if pod is not None else used
            if now - used < 2 * idle_s or meta.get("name") in own() or meta.get("name") in self._making:
                continue
            await self.release(meta["name"])
            deleted.append(meta["name"])
            log.info("abandoned SandboxClaim deleted", claim=meta["name"])
        return deleted
