"""The tests' Kubernetes API server (fake_kube.py) with agent-sandbox installed: its API as the
tools service uses it, and a stand-in for its controllers.

Served beside what FakeKube serves (403 to anything else): SandboxClaims
(extensions.agents.x-k8s.io/v1beta1: create, list, watch, delete), each posted claim validated
against agent-sandbox's own CRD schema (crds/sandboxclaims.yaml; 422 when invalid, and a field the
schema does not declare is invalid too, as strict field validation has it), and Sandboxes
(agents.x-k8s.io/v1beta1: get).

The controller stand-in binds a claim the way agent-sandbox's does: a claim naming a
SandboxWarmPool that does not exist gets `Ready=False, reason WarmPoolNotFound`; else it adopts
one of the pool's warm pods when there is one (a Sandbox named as the claim, annotated
`agents.x-k8s.io/pod-name: <the warm pod>`), or starts a pod named as the claim (cold); the
claim's `additionalPodMetadata` goes onto the pod; once the pod runs, the claim is
`Ready=True` with `status.sandbox.name`. Deleting a claim deletes its Sandbox and pod. The pods
are FakeKube's (fake_kubelet.py runs them; pods/exec reaches them).
"""

from __future__ import annotations

import json
import secrets
import threading
import uuid
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from tests.support.crd_schema import undeclared
from tests.tools.fake_kube import K8S_VERSION, FakeKube, public, selector_matches, serve_watch, status_body
from tests.tools.fake_kubelet import now_rfc3339

CRD = yaml.safe_load((Path(__file__).parent / "crds" / "sandboxclaims.yaml").read_text())
CLAIM_SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
POD_NAME_ANNOTATION = "agents.x-k8s.io/pod-name"


def sandbox_pod(name: str, namespace: str, image: str = "python:3.12-slim") -> dict[str, Any]:
    """A pod as a SandboxTemplate of the cluster's might make it: its own container name, image and
    working directory (an emptyDir), nothing of ours."""
    idle = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {}},
        "spec": {
            "containers": [{"name": "python-runtime", "image": image, "command": ["/bin/sh", "-c", idle],
                            "workingDir": "/home/sandbox", "volumeMounts": [{"name": "work", "mountPath": "/home/sandbox"}]}],
            "volumes": [{"name": "work", "emptyDir": {}}],
        },
    }


class FakeAgentSandbox(FakeKube):
    def __init__(self, *args: Any, pools: dict[str, int] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.pools = dict(pools or {})  # SandboxWarmPool name -> warm pods it keeps
        self.claims: dict[tuple[str, str], dict] = {}
        self.sandboxes: dict[tuple[str, str], dict] = {}
        self.claim_events: list[tuple[int, str, str, dict]] = []
        self.warm: dict[str, list[str]] = {}  # pool -> its free warm pods
        self.claims_posted: list[dict] = []
        self.hold = False  # claims are never bound (a deadline test)
        # The claim says Ready before its pod exists (what a reader whose cache lags the controller's
        # sees): the pod is made only when the Sandbox is read a second time.
        self.ready_early = False
        self._late_pods: dict[tuple[str, str], dict] = {}
        self._sandbox_reads: dict[tuple[str, str], int] = {}

    def fill_pools(self, namespace: str) -> None:
        """Start each pool's warm pods (the warm pool controller's work)."""
        for pool, replicas in self.pools.items():
            for _ in range(replicas):
                name = f"{pool}-{secrets.token_hex(3)}"
                self._start_pod(sandbox_pod(name, namespace))
                self.warm.setdefault(pool, []).append(name)

    # --- routes ------------------------------------------------------------------------------

    def _route(self, method: str, parts: list[str], query: dict[str, str]):
        if parts[:3] == ["apis", "extensions.agents.x-k8s.io", "v1beta1"] and len(parts) >= 6 and parts[5] == "sandboxclaims":
            if len(parts) == 6 and method == "POST":
                return "create", "sandboxclaims", self._create_claim
            if len(parts) == 6 and method == "GET":
                return ("watch" if query.get("watch") in ("true", "1") else "list"), "sandboxclaims", self._claims
            if len(parts) == 7 and method == "DELETE":
                return "delete", "sandboxclaims", self._delete_claim
        if parts[:3] == ["apis", "agents.x-k8s.io", "v1beta1"] and len(parts) == 7 and parts[5] == "sandboxes" and method == "GET":
            return "get", "sandboxes", self._get_sandbox
        return super()._route(method, parts, query)

    def _create_claim(self, handler, parts, query, raw) -> None:
        namespace = parts[4]
        body = json.loads(raw or b"{}")
        self.claims_posted.append(json.loads(json.dumps(body)))
        try:
            jsonschema.validate(body, CLAIM_SCHEMA)
            extra = undeclared(body, CLAIM_SCHEMA)
            if extra:
                raise jsonschema.ValidationError(f"unknown field(s) {extra}")
        except jsonschema.ValidationError as exc:
            self.invalid.append(exc.message)
            self._send(handler, 422, status_body(422, "Invalid", f"SandboxClaim is invalid: {exc.message}"))
            return
        meta = body["metadata"]
        key = (namespace, meta["name"])
        with self.cond:
            if key in self.claims:
                self._send(handler, 409, status_body(409, "AlreadyExists", f'sandboxclaims "{meta["name"]}" already exists'))
                return
            meta.update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339(), generation=1)
            self.claims[key] = body
            self._claim_event("ADDED", key)
            created = public(body)
        self._send(handler, 201, created)
        threading.Thread(target=self._bind, args=(key,), daemon=True).start()

    def _claims(self, handler, parts, query, raw) -> None:
        namespace, selector = parts[4], query.get("labelSelector", "")
        if query.get("watch") in ("true", "1"):
            serve_watch(handler, self.cond, lambda sent: [e for e in self.claim_events if e[0] > sent and e[1] == namespace
                                                          and selector_matches(selector, e[3]["metadata"].get("labels", {}))],
                        int(query.get("resourceVersion") or 0), float(query.get("timeoutSeconds") or 30), lambda: self._closed)
            return
        with self.cond:
            items = [public(c) for (ns, _), c in self.claims.items()
                     if ns == namespace and selector_matches(selector, c["metadata"].get("labels", {}))]
            version = str(self.rv)
        self._send(handler, 200, {"kind": "SandboxClaimList", "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
                                  "metadata": {"resourceVersion": version}, "items": items})

    def _delete_claim(self, handler, parts, query, raw) -> None:
        key = (parts[4], parts[6])
        with self.cond:
            claim = self.claims.pop(key, None)
            if claim is None:
                self._send(handler, 404, status_body(404, "NotFound", f'sandboxclaims "{parts[6]}" not found'))
                return
            claim["metadata"]["resourceVersion"] = self._bump()
            self.claim_events.append((self.rv, key[0], "DELETED", public(claim)))
            sandbox = self.sandboxes.pop(key, None)
            if sandbox is not None:
                pod = (sandbox["metadata"].get("annotations") or {}).get(POD_NAME_ANNOTATION) or key[1]
                self._delete_pod((key[0], pod))  # the Sandbox's owner reference: the pod goes with it
            self.cond.notify_all()
        self._send(handler, 200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})

    def _get_sandbox(self, handler, parts, query, raw) -> None:
        with self.cond:
            sandbox = self.sandboxes.get((parts[4], parts[6]))
        if sandbox is None:
            self._send(handler, 404, status_body(404, "NotFound", f'sandboxes.agents.x-k8s.io "{parts[6]}" not found'))
        else:
            self._send(handler, 200, public(sandbox))
            key = (parts[4], parts[6])
            with self.cond:
                self._sandbox_reads[key] = self._sandbox_reads.get(key, 0) + 1
                late = self._late_pods.pop(key, None) if self._sandbox_reads[key] >= 2 else None
            if late is not None:
                self._start_pod(late)

    # --- the controllers' stand-in -----------------------------------------------------------

    def _claim_event(self, kind: str, key: tuple[str, str]) -> None:
        claim = self.claims[key]
        claim["metadata"]["resourceVersion"] = self._bump()
        self.claim_events.append((self.rv, key[0], kind, public(claim)))
        self.cond.notify_all()

    def _set_ready(self, key: tuple[str, str], status: str, reason: str, message: str, sandbox: str = "") -> None:
        with self.cond:
            claim = self.claims.get(key)
            if claim is None:
                return
            claim["status"] = {"conditions": [{"type": "Ready", "status": status, "reason": reason, "message": message,
                                               "lastTransitionTime": now_rfc3339(), "observedGeneration": 1}],
                               **({"sandbox": {"name": sandbox}} if sandbox else {})}
            self._claim_event("MODIFIED", key)

    def _start_pod(self, pod: dict) -> tuple[str, str]:
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        with self.cond:
            pod["metadata"].update(uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339())
            pod["status"] = {"phase": "Pending", "conditions": []}
            self.pods[key] = pod
            self._emit("ADDED", key)
        threading.Thread(target=self._run_pod, args=(key[0], None, key), daemon=True).start()
        return key

    def _bind(self, key: tuple[str, str]) -> None:
        namespace, name = key
        with self.cond:
            claim = self.claims.get(key)
        if claim is None:
            return
        pool = claim["spec"]["warmPoolRef"]["name"]
        if pool not in self.pools:
            self._set_ready(key, "False", "WarmPoolNotFound", f'SandboxWarmPool "{pool}" not found')
            return
        self._set_ready(key, "False", "DependenciesNotReady", "Pod does not exist")
        if self.hold:
            return
        extra = claim["spec"].get("additionalPodMetadata") or {}
        with self.cond:
            warm = self.warm.get(pool) or []
            adopted = warm.pop(0) if warm else ""
            sandbox = {"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
                       "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()),
                                    "annotations": {POD_NAME_ANNOTATION: adopted} if adopted else {}}}
            self.sandboxes[key] = sandbox
        if adopted:
            pod_key = (namespace, adopted)
            with self.cond:
                meta = self.pods[pod_key]["metadata"]
                meta.setdefault("labels", {}).update(extra.get("labels") or {})
                meta.setdefault("annotations", {}).update(extra.get("annotations") or {})
                self._emit("MODIFIED", pod_key)
        else:
            pod = sandbox_pod(name, namespace)
            pod["metadata"]["labels"].update(extra.get("labels") or {})
            pod["metadata"]["annotations"] = dict(extra.get("annotations") or {})
            if self.ready_early:
                with self.cond:
                    self._late_pods[key] = pod
                self._set_ready(key, "True", "DependenciesReady", "Pod is Ready; Service Exists", sandbox=name)
                return
            pod_key = self._start_pod(pod)
        while not self._closed:
            with self.cond:
                if key not in self.claims or pod_key not in self.pods:
                    return
                if self.pods[pod_key]["status"].get("phase") == "Running":
                    break
                self.cond.wait(timeout=0.5)
        self._set_ready(key, "True", "DependenciesReady", "Pod is Ready; Service Exists", sandbox=name)

    def live_claims(self) -> list[str]:
        with self.cond:
            return [name for _, name in self.claims]

