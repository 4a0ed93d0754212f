"""A Kubernetes API server for the executor tests: real HTTP, the real paths, the real semantics.

It serves exactly what the sandbox Role grants (jobs: create/get/list/watch/delete; pods:
create/get/list/watch/delete; pods/log: get; pods/attach, a websocket: fake_kube_attach.py) and
answers 403 to anything else, recording it. Every Job and Pod posted is validated against the
Kubernetes OpenAPI schema with `kubernetes-validate` (422 when invalid).

Behind the API, small stand-ins for the control plane do what a cluster does:
- the Job controller creates one pod per Job (labels `job-name`, `batch.kubernetes.io/job-name`,
  controller uid, owner reference), sets Job conditions (Complete / Failed with
  BackoffLimitExceeded or DeadlineExceeded) and deletes active pods past activeDeadlineSeconds;
- the scheduler marks pods whose requests exceed the node's capacity `Unschedulable`;
- the kubelet "pulls" the image (anything from registry.invalid fails: ErrImagePull, then
  ImagePullBackOff), then runs the container's command as a local process, its working
  directory the volume (a PersistentVolumeClaim maps to a host directory, honouring subPath),
  kills it with OOMKilled (exit 137) when its resident memory passes the container's memory
  limit, and keeps its combined output as the pod log; a command that cannot be executed is a
  StartError (exit 128), and `FallbackToLogsOnError` puts a failed container's last output in its
  status. A container with `stdin: true` (an MCP server's bare pod) gets a stdin pipe for
  pods/attach, its stdout and stderr kept apart for attach's channels.
The local process is not isolated: this is a stand-in for a container runtime, not a sandbox.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import kubernetes_validate

K8S_VERSION = "1.30"
UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "m": 1e-3}


def quantity(value: str) -> float:
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(value))
    if not match:
        raise ValueError(f"bad quantity {value!r}")
    number, unit = match.groups()
    return float(number) * UNITS.get(unit, 1)


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code}


class FakeKube:
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
        self.requests: list[tuple[str, str]] = []  # (verb, resource)
        self.forbidden: list[str] = []
        self.invalid: list[str] = []
        self.posted: list[dict] = []
        # Simulates a Job whose deadline passes before the executor's own timer (e.g. a restart lost it).
        self.deadline_override_s: float | None = None
        self.fail_next: list[int] = []  # statuses to answer the next requests with (retry tests)
        # Benchmarks: containers "run" in no time and print "ok", so only the API traffic is measured.
        self.instant_containers = False
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
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._closed = False

    # --- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> "FakeKube":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._closed = True
        with self.cond:
            for proc in self.procs.values():
                _kill(proc)
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
        self._send(handler, 201, _public(body))
        threading.Thread(target=self._run_pod, args=(namespace, body, pod), daemon=True).start()
        threading.Thread(target=self._deadline, args=(namespace, name), daemon=True).start()

    def _get_job(self, handler, parts, query, raw) -> None:
        with self.cond:
            job = self.jobs.get((parts[4], parts[6]))
        if job is None:
            self._send(handler, 404, status_body(404, "NotFound", f'jobs.batch "{parts[6]}" not found'))
        else:
            self._send(handler, 200, _public(job))

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
            items = [_public(p) for (ns, _), p in self.pods.items() if ns == namespace and selector_matches(selector, p["metadata"]["labels"])]
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
            created = _public(body)
        self._send(handler, 201, created)
        threading.Thread(target=self._run_pod, args=(namespace, None, key), daemon=True).start()

    def _delete_pod_request(self, handler, parts, query, raw) -> None:
        key = (parts[3], parts[5])
        with self.cond:
            if key not in self.pods:
                self._send(handler, 404, status_body(404, "NotFound", f'pods "{parts[5]}" not found'))
                return
            deleted = _public(self.pods[key])
            self._delete_pod(key)
        self._send(handler, 200, deleted)

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
            self._send(handler, 200, _public(pod))

    def _watch(self, handler, namespace: str, selector: str, since: int, timeout_s: float) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        deadline = time.monotonic() + timeout_s
        sent = since
        while not self._closed:
            with self.cond:
                pending = [e for e in self.events if e[0] > sent and e[1] == namespace and selector_matches(selector, e[3]["metadata"]["labels"])]
                if not pending:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self.cond.wait(timeout=min(remaining, 0.5))
                    continue
            for rv, _, kind, pod in pending:
                line = (json.dumps({"type": kind, "object": pod}) + "\n").encode()
                handler.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                handler.wfile.flush()
                sent = rv
        handler.wfile.write(b"0\r\n\r\n")
        handler.wfile.flush()

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
        self.events.append((self.rv, key[0], kind, _public(pod)))
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
            _kill(proc)
        if key in self.pods:
            self._emit("DELETED", key)
            del self.pods[key]

    def _run_pod(self, namespace: str, job: dict | None, key: tuple[str, str]) -> None:
        spec = self.pods[key]["spec"]
        container = spec["containers"][0]
        requests = container.get("resources", {}).get("requests", {})
        short = [r for r in ("cpu", "memory") if r in requests and quantity(requests[r]) > self.node[r]]
        if short:
            message = f"0/1 nodes are available: {', '.join('1 Insufficient ' + r for r in short)}. preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."
            self._update(key, lambda s: s["conditions"].append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}))
            return
        self._update(key, lambda s: s["conditions"].append({"type": "PodScheduled", "status": "True"}))
        image = container["image"]
        if image.startswith("registry.invalid/"):
            pull = f'failed to pull and unpack image "{image}": failed to resolve reference: dial tcp: lookup registry.invalid: no such host'
            self._update(key, lambda s: s.update(containerStatuses=[_status(container["image"], {"waiting": {"reason": "ErrImagePull", "message": pull}}, name=container["name"])]))
            time.sleep(0.2)
            self._update(key, lambda s: s.update(containerStatuses=[_status(container["image"], {"waiting": {"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{image}"'}}, name=container["name"])]))
            return
        if self.instant_containers:
            with self.cond:
                self.logs[key] = bytearray(b"ok\n")
            stamp = now_rfc3339()
            self._update(key, lambda s: s.update(phase="Succeeded", containerStatuses=[_status(container["image"], {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": stamp, "finishedAt": stamp}}, name=container["name"])]))
            return
        cwd = self._volume_dir(spec, container)
        env = {e["name"]: e["value"] for e in container.get("env", [])}
        env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
        # A container with `stdin: true` (an MCP server pod) keeps stdin open for pods/attach, and
        # its stdout and stderr apart (attach's channels 1 and 2); the log has both.
        interactive = bool(container.get("stdin"))
        with self.cond:
            if key not in self.pods:
                return
            self.logs[key] = bytearray()
            try:
                proc = subprocess.Popen(container["command"], cwd=cwd, env=env,
                                        stdin=subprocess.PIPE if interactive else subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE if interactive else subprocess.STDOUT, start_new_session=True)
            except OSError as exc:
                proc = None
                start_error = exc
            else:
                self.procs[key] = proc
        if proc is None:
            self._start_failed(namespace, job, key, container, start_error)
            return
        started = now_rfc3339()
        self._update(key, lambda s: s.update(phase="Running", containerStatuses=[_status(container["image"], {"running": {"startedAt": started}}, ready=True, name=container["name"])]))
        limit = quantity(container.get("resources", {}).get("limits", {}).get("memory", "0") or "0")
        oom = threading.Event()
        threading.Thread(target=self._memory_guard, args=(proc, limit, oom), daemon=True).start()
        try:
            if interactive:
                errors = threading.Thread(target=self._copy_output, args=(key, proc.stderr, 2), daemon=True)
                errors.start()
                self._copy_output(key, proc.stdout, 1)
                errors.join()
            else:
                self._copy_output(key, proc.stdout, 1)
            code = proc.wait()
            with self.cond:
                if self.procs.pop(key, None) is None:
                    return  # deleted (job deleted or deadline): no terminal status
            if oom.is_set():
                terminated = {"exitCode": 137, "reason": "OOMKilled"}
            else:
                terminated = {"exitCode": code if code >= 0 else 128 - code, "reason": "Completed" if code == 0 else "Error"}
            if terminated["exitCode"] and container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
                with self.cond:
                    tail = bytes(self.logs.get(key, b""))[-2048:].decode(errors="replace").splitlines()[-80:]
                if tail:
                    terminated["message"] = "\n".join(tail) + "\n"
            terminated.update(startedAt=started, finishedAt=now_rfc3339())
            self._finish(namespace, job, key, container, terminated)
        finally:
            self._detach_all(key)

    def _copy_output(self, key: tuple[str, str], stream, channel: int) -> None:
        """The container's output into its log and to every attached stream."""
        for chunk in iter(lambda: stream.read1(65536), b""):
            with self.cond:
                if key in self.logs:
                    self.logs[key] += chunk
                sinks = list(self.attached.get(key, ()))
            for sink in sinks:
                sink(channel, chunk)

    def _start_failed(self, namespace: str, job: dict | None, key: tuple[str, str], container: dict, exc: OSError) -> None:
        """The runtime could not exec the command: what containerd reports (StartError, exit 128)."""
        command = container["command"][0]
        if os.path.isabs(command):
            why = f"exec: \"{command}\": stat {command}: no such file or directory" if isinstance(exc, FileNotFoundError) else f"exec: \"{command}\": {exc.strerror}"
        else:
            why = f"exec: \"{command}\": executable file not found in $PATH"
        message = f"failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: {why}: unknown"
        stamp = now_rfc3339()
        self._finish(namespace, job, key, container, {"exitCode": 128, "reason": "StartError", "message": message, "startedAt": stamp, "finishedAt": stamp})

    def _finish(self, namespace: str, job: dict | None, key: tuple[str, str], container: dict, terminated: dict) -> None:
        phase = "Succeeded" if terminated["exitCode"] == 0 else "Failed"
        self._update(key, lambda s: s.update(phase=phase, containerStatuses=[_status(container["image"], {"terminated": terminated}, name=container["name"])]))
        if job is None:
            return
        with self.cond:
            live = self.jobs.get((namespace, job["metadata"]["name"]))
            if live is not None:
                stamp = now_rfc3339()
                if phase == "Succeeded":
                    live["status"].update(active=0, succeeded=1, completionTime=stamp, conditions=[{"type": "SuccessCriteriaMet", "status": "True"}, {"type": "Complete", "status": "True", "lastTransitionTime": stamp}])
                else:
                    live["status"].update(active=0, failed=1, conditions=[{"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded"}, {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit", "lastTransitionTime": stamp}])
                live["metadata"]["resourceVersion"] = self._bump()

    def _memory_guard(self, proc: subprocess.Popen, limit: float, oom: threading.Event) -> None:
        """The cgroup OOM killer's stand-in: SIGKILL the container when its processes' resident memory
        together passes the limit (a cgroup counts them all, the command's children included)."""
        while limit and proc.poll() is None:
            rss = 0
            for pid in _process_tree(proc.pid):
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                    rss += int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024
                except (OSError, AttributeError):
                    continue
            if rss > limit:
                oom.set()
                _kill(proc)
                return
            time.sleep(0.01)

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

    def _volume_dir(self, spec: dict, container: dict) -> str:
        mount = next((m for m in container.get("volumeMounts", []) if m["mountPath"] == container.get("workingDir", "/workspace")), None)
        if mount is None:
            return tempfile.mkdtemp(dir=self._scratch.name)  # the image's own working directory
        volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
        if "persistentVolumeClaim" in volume:
            base = self.volumes[volume["persistentVolumeClaim"]["claimName"]]
        else:
            base = Path(tempfile.mkdtemp(dir=self._scratch.name))
        path = Path(base) / mount.get("subPath", "")
        path.mkdir(parents=True, exist_ok=True)  # the kubelet creates a missing subPath
        return str(path)

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


def _status(image: str, state: dict, ready: bool = False, name: str = "sandbox") -> dict:
    return {"name": name, "image": image, "imageID": "", "ready": ready, "restartCount": 0, "started": "running" in state, "state": state}


def _public(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if not k.startswith("_")}


def _process_tree(root: int) -> list[int]:
    """`root` and its descendants (a container's processes, which a real pod's PID namespace holds)."""
    found, pending = [], [root]
    while pending:
        pid = pending.pop()
        found.append(pid)
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                pending.extend(int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split())
        except (OSError, ValueError):
            continue
    return found


def _kill(proc: subprocess.Popen) -> None:
    """End the container: its process group and every descendant's group (the command may run in a
    session of its own), as the end of a pod's PID namespace would."""
    own = os.getpgrp()
    for pid in _process_tree(proc.pid):
        try:
            group = os.getpgid(pid)
            if group != own:
                os.killpg(group, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
