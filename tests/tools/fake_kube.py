"""A Kubernetes API server for the executor tests: real HTTP, the real paths, the real semantics.

It serves exactly what the sandbox Role grants (jobs: create/get/list/watch/delete; pods:
create/get/list/watch/delete/patch; pods/log: get; pods/attach and pods/exec, websockets:
fake_kube_attach.py, fake_kube_exec.py) and
answers 403 to anything else, recording it. Every Job and Pod posted, and every pod as a patch
leaves it, is validated against the Kubernetes OpenAPI schema with `kubernetes-validate` (422
when invalid). A JSON merge patch carrying `metadata.resourceVersion` applies only to that
version (409 Conflict otherwise), as the API server's optimistic concurrency does.

Behind the API, small stand-ins for the control plane do what a cluster does:
- the Job controller creates one pod per Job (labels `job-name`, `batch.kubernetes.io/job-name`,
  controller uid, owner reference), sets Job conditions (Complete / Failed with
  BackoffLimitExceeded or DeadlineExceeded) and deletes active pods past activeDeadlineSeconds;
- the node (fake_kubelet.py) schedules, "pulls" and runs each pod's container as a local process.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs, urlparse

import kubernetes_validate

from tests.tools.fake_kubelet import Kubelet, kill_container, now_rfc3339, quantity

K8S_VERSION = "1.30"

def selector_matches(selector: str, labels: dict[str, str]) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        else:
            key, value = re.split(r"==?", term, maxsplit=1)
            if labels.get(key) != value:
                return False
    return True


def serve_watch(handler, cond: threading.Condition, pending: Callable[[int], list[tuple[int, str, str, dict]]],
                since: int, timeout_s: float, closed: Callable[[], bool]) -> None:
    """A watch answered as the API server streams it: chunked, one JSON event a line. `pending(rv)`
    (called under `cond`) gives the events (rv, namespace, type, object) after the last sent; the
    stream ends after `timeout_s` or once `closed()`."""
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    deadline = time.monotonic() + timeout_s
    sent = since
    while not closed():
        with cond:
            events = pending(sent)
            if not events:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or closed():
                    break
                cond.wait(timeout=min(remaining, 0.5))
                continue
        for rv, _, kind, obj in events:
            line = (json.dumps({"type": kind, "object": obj}) + "\n").encode()
            handler.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
            handler.wfile.flush()
            sent = rv
    handler.wfile.write(b"0\r\n\r\n")
    handler.wfile.flush()


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code}


class FakeKube(Kubelet):
    def __init__(self, volumes: dict[str, Path] | None = None, node_cpu: str = "4", node_memory: str = "8Gi"):
        self.volumes = volumes or {}  # claimName -> host directory
        self.node = {"cpu": quantity(node_cpu), "memory": quantity(node_memory)}
        self.cond = threading.Condition()
        self.rv = 100
        self.jobs: dict[tuple[str, str], dict] = {}
        self.pods: dict[tuple[str, str], dict] = {}
        self.events: list[tuple[int, str, str, dict]] = []  # (rv, namespace, type, pod)
        self.logs: dict[tuple[str, str], bytearray] = {}
        self.procs: dict[tuple[str, str], subprocess.Popen] = {}
        # pods/attach: per pod, the attached streams' sinks (channel, bytes); None ends the stream.
        self.attached: dict[tuple[str, str], list] = {}
        self.attaches: list[str] = []  # the subprotocol each attach agreed on
        # The channel subprotocols this API server speaks, best first (before 1.30: v4 only).
        self.attach_protocols: tuple[str, ...] = ("v5.channel.k8s.io", "v4.channel.k8s.io")
        # pods/exec: (pod, subprotocol, command) of each exec served; the processes running per pod.
        self.execs_served: list[tuple[str, str, list[str]]] = []
        self.exec_procs: dict[tuple[str, str], list[subprocess.Popen]] = {}
        self.workdirs: dict[tuple[str, str], int] = {}  # a pod's working directory, held open (renames follow it)
        self.patches: list[dict] = []
        self.requests: list[tuple[str, str]] = []  # (verb, resource)
        self.forbidden: list[str] = []
        self.invalid: list[str] = []
        self.posted: list[dict] = []
        # Simulates a Job whose deadline passes before the executor's own timer (e.g. a restart lost it).
        self.deadline_override_s: float | None = None
        self.fail_next: list[int] = []  # statuses to answer the next requests with (retry tests)
        # Benchmarks: containers "run" in no time and print "ok", so only the API traffic is measured.
        self.instant_containers = False
        self.start_delay_s = 0.0  # a scheduled pod's container starts this late (a slow node, a loaded run)
        self._scratch = tempfile.TemporaryDirectory(prefix="fake-kube-")
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                fake._dispatch(self, "GET")

            def do_POST(self):
                fake._dispatch(self, "POST")

            def do_DELETE(self):
                fake._dispatch(self, "DELETE")

            def do_PUT(self):
                fake._dispatch(self, "PUT")

            def do_PATCH(self):
                fake._dispatch(self, "PATCH")

            def log_message(self, *args):
                pass

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        # poll_interval: shutdown() waits for the loop to look (0.5 s by default, paid by every test)
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._closed = False

    # --- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> "FakeKube":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._closed = True
        with self.cond:
            for proc in self.procs.values():
                kill_container(proc)
            self.cond.notify_all()
        self.server.shutdown()
        self.server.server_close()
        self._scratch.cleanup()

    def kubeconfig(self, directory: Path) -> Path:
        path = Path(directory) / "kubeconfig.json"
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "tools", "user": {"token": "fake-token"}}],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "tools"}}],
                    "current-context": "fake",
                }
            )
        )
        return path

    # --- HTTP ----------------------------------------------------------------------------------

    def _send(self, handler, code: int, body: dict | str, content_type: str = "application/json") -> None:
        data = (json.dumps(body) if isinstance(body, dict) else body).encode()
        handler.send_response(code)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def answer(self, handler, code: int, body: dict | str) -> None:
        """A plain HTTP answer (for the pods/attach module: a refusal before the upgrade)."""
        self._send(handler, code, body)

    def _dispatch(self, handler, method: str) -> None:
        url = urlparse(handler.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        parts = url.path.strip("/").split("/")
        try:
            if self.fail_next:
                code = self.fail_next.pop(0)
                self._send(handler, code, status_body(code, "ServiceUnavailable", "try again"))
                return
            route = self._route(method, parts, query)
            if route is None:
                self.forbidden.append(f"{method} {url.path}")
                self._send(handler, 403, status_body(403, "Forbidden", f"{method} {url.path} is not granted to the tools service"))
                return
            verb, resource, action = route
            self.requests.append((verb, resource))
            action(handler, parts, query, raw)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _route(self, method: str, parts: list[str], query: dict[str, str]):
        if parts[:3] == ["apis", "batch", "v1"] and len(parts) >= 6 and parts[3] == "namespaces" and parts[5] == "jobs":
            if len(parts) == 6 and method == "POST":
                return "create", "jobs", self._create_job
            if len(parts) == 7 and method == "GET":
                return "get", "jobs", self._get_job
            if len(parts) == 7 and method == "DELETE":
                return "delete", "jobs", self._delete_job
        if parts[:2] == ["api", "v1"] and len(parts) >= 5 and parts[2] == "namespaces" and parts[4] == "pods":
            if len(parts) == 5 and method == "GET":
                return ("watch" if query.get("watch") in ("true", "1") else "list"), "pods", self._pods
            if len(parts) == 5 and method == "POST":
                return "create", "pods", self._create_pod
            if len(parts) == 6 and method == "GET":
                return "get", "pods", self._get_pod
            if len(parts) == 6 and method == "DELETE":
                return "delete", "pods", self._delete_pod_request
            if len(parts) == 6 and method == "PATCH":
                return "patch", "pods", self._patch_pod
            if len(parts) == 7 and parts[6] == "exec" and method in ("GET", "POST"):
                # A websocket upgrade: authorized as "create" since 1.31 (before, the HTTP verb).
                return "create", "pods/exec", self._exec
            if len(parts) == 7 and parts[6] == "log" and method == "GET":
                return "get", "pods/log", self._pod_log
            if len(parts) == 7 and parts[6] == "attach" and method == "GET":
                # A websocket upgrade: API servers since 1.31 authorize it as "create" (before, "get").
                return "create", "pods/attach", self._attach
        return None

    # --- jobs ----------------------------------------------------------------------------------

    def _create_job(self, handler, parts, query, raw) -> None:
        namespace = parts[4]
        body = json.loads(raw or b"{}")
        self.posted.append(body)
        try:
            kubernetes_validate.validate(body, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            self.invalid.append(f"{exc.path}: {exc.message}" if hasattr(exc, "path") else str(exc))
            self._send(handler, 422, status_body(422, "Invalid", f"Job is invalid: {exc}"))
            return
        meta = body.setdefault("metadata", {})
        if meta.get("namespace", namespace) != namespace:
            self._send(handler, 400, status_body(400, "BadRequest", "the namespace of the object does not match the namespace of the request"))
            return
        name = meta["name"]
        with self.cond:
            if (namespace, name) in self.jobs:
                self._send(handler, 409, status_body(409, "AlreadyExists", f'jobs.batch "{name}" already exists'))
                return
            meta.update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339(), resourceVersion=self._bump())
            body["status"] = {"startTime": now_rfc3339(), "active": 1}
            body["_created"] = time.monotonic()
            self.jobs[(namespace, name)] = body
            pod = self._pod_for(namespace, body)
        self._send(handler, 201, public(body))
        threading.Thread(target=self._run_pod, args=(namespace, body, pod), daemon=True).start()
        threading.Thread(target=self._deadline, args=(namespace, name), daemon=True).start()

    def _get_job(self, handler, parts, query, raw) -> None:
        with self.cond:
            job = self.jobs.get((parts[4], parts[6]))
        if job is None:
            self._send(handler, 404, status_body(404, "NotFound", f'jobs.batch "{parts[6]}" not found'))
        else:
            self._send(handler, 200, public(job))

    def _delete_job(self, handler, parts, query, raw) -> None:
        namespace, name = parts[4], parts[6]
        options = json.loads(raw or b"{}")
        propagation = query.get("propagationPolicy") or options.get("propagationPolicy") or "Orphan"
        with self.cond:
            job = self.jobs.pop((namespace, name), None)
            if job is None:
                self._send(handler, 404, status_body(404, "NotFound", f'jobs.batch "{name}" not found'))
                return
            if propagation in ("Background", "Foreground"):
                for key, pod in list(self.pods.items()):
                    if key[0] == namespace and pod["metadata"]["labels"].get("job-name") == name:
                        self._delete_pod(key)
            self._bump()
        self._send(handler, 200, {"kind": "Status", "apiVersion": "v1", "status": "Success", "details": {"name": name, "group": "batch", "kind": "jobs"}})

    # --- pods ----------------------------------------------------------------------------------

    def _pods(self, handler, parts, query, raw) -> None:
        namespace, selector = parts[3], query.get("labelSelector", "")
        if query.get("watch") in ("true", "1"):
            self._watch(handler, namespace, selector, int(query.get("resourceVersion") or 0), float(query.get("timeoutSeconds") or 30))
            return
        with self.cond:
            items = [public(p) for (ns, _), p in self.pods.items() if ns == namespace and selector_matches(selector, p["metadata"]["labels"])]
            version = str(self.rv)
        self._send(handler, 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": version}, "items": items})

    def _create_pod(self, handler, parts, query, raw) -> None:
        """A bare pod (an MCP server's): validated, scheduled and run like a Job's, never restarted."""
        namespace = parts[3]
        body = json.loads(raw or b"{}")
        self.posted.append(body)
        try:
            kubernetes_validate.validate(body, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            self.invalid.append(f"{exc.path}: {exc.message}" if hasattr(exc, "path") else str(exc))
            self._send(handler, 422, status_body(422, "Invalid", f"Pod is invalid: {exc}"))
            return
        meta = body.setdefault("metadata", {})
        if meta.get("namespace", namespace) != namespace:
            self._send(handler, 400, status_body(400, "BadRequest", "the namespace of the object does not match the namespace of the request"))
            return
        key = (namespace, meta["name"])
        with self.cond:
            if key in self.pods:
                self._send(handler, 409, status_body(409, "AlreadyExists", f'pods "{meta["name"]}" already exists'))
                return
            meta.update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339())
            body["status"] = {"phase": "Pending", "conditions": []}
            self.pods[key] = body
            self._emit("ADDED", key)
            created = public(body)
        self._send(handler, 201, created)
        threading.Thread(target=self._run_pod, args=(namespace, None, key), daemon=True).start()

    def _delete_pod_request(self, handler, parts, query, raw) -> None:
        key = (parts[3], parts[5])
        with self.cond:
            if key not in self.pods:
                self._send(handler, 404, status_body(404, "NotFound", f'pods "{parts[5]}" not found'))
                return
            deleted = public(self.pods[key])
            self._delete_pod(key)
        self._send(handler, 200, deleted)

    def _patch_pod(self, handler, parts, query, raw) -> None:
        from tests.tools.fake_kube_patch import serve_patch  # merge patches with preconditions live there

        serve_patch(self, handler, parts, raw)

    def _exec(self, handler, parts, query, raw) -> None:
        from tests.tools.fake_kube_exec import serve_exec  # the websocket side lives there

        serve_exec(self, handler, parts)

    def exec_process(self, key: tuple[str, str], command: list[str]) -> subprocess.Popen:
        """A new process in the pod's container (here: a local process in its working directory)."""
        with self.cond:
            pod = self.pods[key]
            fd = self.workdirs.get(key)
        container = pod["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in container.get("env", [])}
        env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
        cwd = os.readlink(f"/proc/self/fd/{fd}") if fd is not None else None
        return subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)

    def _attach(self, handler, parts, query, raw) -> None:
        from tests.tools.fake_kube_attach import serve_attach  # the websocket side lives there

        serve_attach(self, handler, parts, query)

    def _detach_all(self, key: tuple[str, str]) -> None:
        """The container ended: every attached stream ends with it."""
        with self.cond:
            sinks = self.attached.pop(key, [])
        for sink in sinks:
            sink(None, b"")

    def _get_pod(self, handler, parts, query, raw) -> None:
        with self.cond:
            pod = self.pods.get((parts[3], parts[5]))
        if pod is None:
            self._send(handler, 404, status_body(404, "NotFound", f'pods "{parts[5]}" not found'))
        else:
            self._send(handler, 200, public(pod))

    def _watch(self, handler, namespace: str, selector: str, since: int, timeout_s: float) -> None:
        serve_watch(handler, self.cond, lambda sent: [e for e in self.events if e[0] > sent and e[1] == namespace
                                                      and selector_matches(selector, e[3]["metadata"]["labels"])],
                    since, timeout_s, lambda: self._closed)

    def _pod_log(self, handler, parts, query, raw) -> None:
        key = (parts[3], parts[5])
        with self.cond:
            pod = self.pods.get(key)
            log = bytes(self.logs.get(key, b""))
        if pod is None:
            self._send(handler, 404, status_body(404, "NotFound", f'pods "{parts[5]}" not found'))
            return
        statuses = pod["status"].get("containerStatuses") or []
        if not statuses or "waiting" in statuses[0]["state"]:
            self._send(handler, 400, status_body(400, "BadRequest", f'container "sandbox" in pod "{parts[5]}" is waiting to start'))
            return
        if query.get("limitBytes"):
            log = log[: int(query["limitBytes"])]
        self._send(handler, 200, log.decode(errors="replace"), "text/plain")

    # --- the control plane's stand-ins -----------------------------------------------------------

    def _bump(self) -> str:
        self.rv += 1
        return str(self.rv)

    def _emit(self, kind: str, key: tuple[str, str]) -> None:
        pod = self.pods[key]
        pod["metadata"]["resourceVersion"] = self._bump()
        self.events.append((self.rv, key[0], kind, public(pod)))
        self.cond.notify_all()

    def _pod_for(self, namespace: str, job: dict) -> tuple[str, str]:
        name = f"{job['metadata']['name']}-{secrets.token_hex(3)[:5]}"
        template = json.loads(json.dumps(job["spec"]["template"]))
        uid = job["metadata"]["uid"]
        labels = {**template["metadata"].get("labels", {}), "job-name": job["metadata"]["name"], "batch.kubernetes.io/job-name": job["metadata"]["name"], "controller-uid": uid, "batch.kubernetes.io/controller-uid": uid}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name, "namespace": namespace, "uid": str(uuid.uuid4()), "labels": labels, "creationTimestamp": now_rfc3339(),
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job["metadata"]["name"], "uid": uid, "controller": True, "blockOwnerDeletion": True}],
            },
            "spec": template["spec"],
            "status": {"phase": "Pending", "conditions": []},
        }
        key = (namespace, name)
        self.pods[key] = pod
        self._emit("ADDED", key)
        return key

    def _update(self, key: tuple[str, str], change) -> bool:
        with self.cond:
            if key not in self.pods:
                return False
            change(self.pods[key]["status"])
            self._emit("MODIFIED", key)
            return True

    def _delete_pod(self, key: tuple[str, str]) -> None:
        proc = self.procs.pop(key, None)
        if proc:
            kill_container(proc)
        for running in self.exec_procs.pop(key, []):
            kill_container(running)
        fd = self.workdirs.pop(key, None)
        if fd is not None:
            os.close(fd)
        if key in self.pods:
            self._emit("DELETED", key)
            del self.pods[key]

    def _deadline(self, namespace: str, name: str) -> None:
        with self.cond:
            job = self.jobs.get((namespace, name))
            if job is None:
                return
            seconds = self.deadline_override_s if self.deadline_override_s is not None else job["spec"].get("activeDeadlineSeconds")
        if not seconds:
            return
        end = job["_created"] + seconds
        while time.monotonic() < end:
            time.sleep(min(0.05, max(end - time.monotonic(), 0)))
            with self.cond:
                if (namespace, name) not in self.jobs or self.jobs[(namespace, name)]["status"].get("conditions"):
                    return
        with self.cond:
            live = self.jobs.get((namespace, name))
            if live is None or live["status"].get("conditions"):
                return
            live["status"].update(active=0, failed=1, conditions=[{"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": "Job was active longer than specified deadline", "lastTransitionTime": now_rfc3339()}])
            live["metadata"]["resourceVersion"] = self._bump()
            for key, pod in list(self.pods.items()):
                if key[0] == namespace and pod["metadata"]["labels"].get("job-name") == name:
                    self._delete_pod(key)

    # --- what tests look at ----------------------------------------------------------------------

    def live_objects(self) -> tuple[list[str], list[str]]:
        with self.cond:
            return [n for _, n in self.jobs], [n for _, n in self.pods]

    def running_processes(self) -> int:
        with self.cond:
            return sum(1 for p in self.procs.values() if p.poll() is None)


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        # Clients hang up on watches they no longer need; that is not an error.
        pass


def public(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if not k.startswith("_")}
