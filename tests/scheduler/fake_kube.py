"""A Kubernetes API for Leases (coordination.k8s.io/v1), served by the test.

It follows the real API where the scheduler depends on it: 404 for a missing lease, 409 on
create of an existing one and on an update with a stale resourceVersion, a new
resourceVersion on every write, and 403 for every verb the Helm chart's Role does not grant
(only get, create and update on leases). Every object written is validated against the
Kubernetes OpenAPI schema (kubernetes-validate, strict).
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import kubernetes_validate

K8S_VERSION = kubernetes_validate.latest_version()
_ITEM = re.compile(r"^/apis/coordination\.k8s\.io/v1/namespaces/([^/]+)/leases/([^/?]+)$")
# metav1.MicroTime is parsed with Go's RFC3339Micro layout: six fractional digits, required.
_MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)$")
_COLLECTION = re.compile(r"^/apis/coordination\.k8s\.io/v1/namespaces/([^/]+)/leases$")


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class FakeLeaseApi:
    def __init__(self):
        self.leases: dict[tuple[str, str], dict] = {}
        self.verbs: list[str] = []
        self.invalid: list[str] = []
        self.down = False  # answer 503 to everything, as an unreachable API server would
        self._version = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> "FakeLeaseApi":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def client(self):
        from kubernetes import client

        configuration = client.Configuration(host=self.url)
        return client.CoordinationV1Api(client.ApiClient(configuration))

    def _handler(self):
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> dict:
                return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")

            def _handle(self, verb: str) -> None:
                with api._lock:
                    code, body = api._serve(verb, self.path.split("?")[0], self._body() if verb in ("POST", "PUT", "PATCH") else None)
                self._send(code, body)

            def do_GET(self):
                self._handle("GET")

            def do_POST(self):
                self._handle("POST")

            def do_PUT(self):
                self._handle("PUT")

            def do_PATCH(self):
                self._handle("PATCH")

            def do_DELETE(self):
                self._handle("DELETE")

        return Handler

    def _serve(self, verb: str, path: str, body: dict | None) -> tuple[int, dict]:
        self.verbs.append(verb)
        if self.down:
            return 503, _status(503, "ServiceUnavailable", "the server is currently unable to handle the request")
        item, collection = _ITEM.match(path), _COLLECTION.match(path)
        allowed = (verb == "GET" and item) or (verb == "POST" and collection) or (verb == "PUT" and item)
        if not allowed:
            return 403, _status(403, "Forbidden", f"{verb} {path} is forbidden: the Role grants get, create, update on leases")
        namespace, name = (item or collection).group(1), (item.group(2) if item else (body or {}).get("metadata", {}).get("name"))
        key = (namespace, name)
        if verb == "GET":
            if key not in self.leases:
                return 404, _status(404, "NotFound", f'leases.coordination.k8s.io "{name}" not found')
            return 200, self.leases[key]
        try:
            kubernetes_validate.validate(body, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            self.invalid.append(str(exc))
            return 422, _status(422, "Invalid", str(exc))
        for field in ("acquireTime", "renewTime"):
            value = body.get("spec", {}).get(field)
            if value is not None and not _MICRO_TIME.match(value):
                self.invalid.append(f"{field}={value}")
                return 400, _status(400, "BadRequest", f'parsing time "{value}" as "2006-01-02T15:04:05.000000Z07:00"')
        if verb == "POST":
            if key in self.leases:
                return 409, _status(409, "AlreadyExists", f'leases.coordination.k8s.io "{name}" already exists')
            return 201, self._store(key, body)
        current = self.leases.get(key)
        if current is None:
            return 404, _status(404, "NotFound", f'leases.coordination.k8s.io "{name}" not found')
        sent = body.get("metadata", {}).get("resourceVersion")
        if sent != current["metadata"]["resourceVersion"]:
            return 409, _status(409, "Conflict", "the object has been modified; please apply your changes to the latest version")
        return 200, self._store(key, body)

    def _store(self, key: tuple[str, str], body: dict) -> dict:
        self._version += 1
        stored = json.loads(json.dumps(body))
        stored["metadata"].update({"namespace": key[0], "resourceVersion": str(self._version),
                                   "uid": f"uid-{key[1]}"})
        self.leases[key] = stored
        return stored
