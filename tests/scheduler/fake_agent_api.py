"""The Lease API of fake_kube.py plus the agentmesh.dev group, as a cluster with the chart's CRDs
installed serves it: `Agent` and `ModelConfig` resources over the real wire protocol — a list with its
resourceVersion, a watch streaming `{"type", "object"}` lines after a resourceVersion until
`timeoutSeconds`, and JSON merge patches of the status subresource (which never touch the spec
or the generation).

The API answers exactly what the chart's Role grants the scheduler in a managed namespace
(list and watch agents and modelconfigs, patch their status) and 403 to the rest (a Secret
included), recording it. The test plays
`kubectl`: `apply()` validates a manifest against the CRD's OpenAPI schema as rendered by the
chart (an invalid one is refused, as the API server would), bumps `metadata.generation` when the
spec changes and sends the event; `delete()` removes it.
"""

from __future__ import annotations

import copy
import json
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import parse_qs

import jsonschema

from tests.scheduler.fake_kube import FakeLeaseApi, _status
from tests.tools.fake_kube import serve_watch

GROUP_PATH = "/apis/agentmesh.dev/v1alpha1/namespaces/"


PLURALS = {"Agent": "agents", "ModelConfig": "modelconfigs"}


def crd_schema(plural: str = "agents") -> dict:
    from tests.helm.helm_support import render

    crd = render().get("CustomResourceDefinition", f"{plural}.agentmesh.dev")
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def agent_crd_schema() -> dict:
    return crd_schema("agents")


def merge_patch(target, patch):
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


class FakeAgentApi(FakeLeaseApi):
    def __init__(self):
        self.schemas = {plural: crd_schema(plural) for plural in PLURALS.values()}
        self.objects: dict[tuple[str, str, str], dict] = {}  # (plural, namespace, name)
        # (resourceVersion, namespace, type, object, plural)
        self.events: list[tuple[int, str, str, dict, str]] = []
        self.forbidden: list[str] = []
        self.status_writes: list[tuple[str, str]] = []
        self.watches = 0
        self.closed = False
        self.cond = threading.Condition()
        self.rv = 1000
        super().__init__()

    def __exit__(self, *exc) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        super().__exit__(*exc)

    def kubeconfig(self, directory: Path) -> Path:
        path = Path(directory) / "kubeconfig.json"
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "scheduler", "user": {"token": "fake-token"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "scheduler"}}],
            "current-context": "fake"}))
        return path

    # --- what the test does, as kubectl ----------------------------------------------------------

    def apply(self, manifest: dict) -> dict:
        manifest = copy.deepcopy(manifest)
        plural = PLURALS[manifest["kind"]]
        jsonschema.validate(manifest, self.schemas[plural])  # the API server's CRD validation (422)
        meta = manifest["metadata"]
        key = (plural, meta["namespace"], meta["name"])
        with self.cond:
            current = self.objects.get(key)
            if current is None:
                meta.update(uid=str(uuid.uuid4()), generation=1,
                            creationTimestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
                obj, kind = manifest, "ADDED"
            else:
                obj, kind = copy.deepcopy(current), "MODIFIED"
                if obj["spec"] != manifest["spec"]:
                    obj["metadata"]["generation"] += 1
                obj["spec"] = manifest["spec"]
            self._emit(key, obj, kind)
            return copy.deepcopy(obj)

    def delete(self, namespace: str, name: str, plural: str = "agents") -> None:
        with self.cond:
            obj = self.objects.pop((plural, namespace, name))
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
            self.events.append((self.rv, namespace, "DELETED", copy.deepcopy(obj), plural))
            self.cond.notify_all()

    def get(self, namespace: str, name: str, plural: str = "agents") -> dict:
        with self.cond:
            return copy.deepcopy(self.objects[(plural, namespace, name)])

    def ready(self, namespace: str, name: str, plural: str = "agents") -> dict | None:
        """The Ready condition of the resource's status, once written."""
        with self.cond:
            obj = self.objects.get((plural, namespace, name)) or {}
            conditions = (obj.get("status") or {}).get("conditions") or []
            return next((dict(c) for c in conditions if c.get("type") == "Ready"), None)

    def _emit(self, key: tuple[str, str, str], obj: dict, kind: str) -> None:
        plural, namespace, _ = key
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        obj["metadata"]["namespace"] = namespace
        obj.setdefault("apiVersion", "agentmesh.dev/v1alpha1")
        obj.setdefault("kind", next(k for k, p in PLURALS.items() if p == plural))
        self.objects[key] = obj
        self.events.append((self.rv, namespace, kind, copy.deepcopy(obj), plural))
        self.cond.notify_all()

    # --- the API ---------------------------------------------------------------------------------

    def _handler(self):
        base = super()._handler()
        api = self

        class Handler(base):
            protocol_version = "HTTP/1.1"  # a watch streams its events as chunks, as the API server does

            def reply(self, code: int, body: dict) -> None:
                self._send(code, body)

            def payload(self) -> dict:
                return self._body()

            def _handle(self, verb: str) -> None:
                path, _, query = self.path.partition("?")
                if path.startswith(GROUP_PATH):
                    api._serve_group(self, verb, path, {k: v[-1] for k, v in parse_qs(query).items()})
                else:
                    super()._handle(verb)

        return Handler

    def _serve_group(self, handler, verb: str, path: str, query: dict[str, str]) -> None:
        parts = path[len(GROUP_PATH):].split("/")  # ns, agents|modelconfigs[, name[, status]]
        watching = query.get("watch") in ("true", "1")
        plurals = set(PLURALS.values())
        if verb == "GET" and len(parts) == 2 and parts[1] in plurals:
            if watching:
                self._watch(handler, parts[0], parts[1], int(query.get("resourceVersion") or 0),
                            float(query.get("timeoutSeconds") or 30))
            else:
                self._list(handler, parts[0], parts[1])
            return
        if verb == "PATCH" and len(parts) == 4 and parts[1] in plurals and parts[3] == "status":
            self._patch_status(handler, parts[0], parts[2], parts[1])
            return
        self.forbidden.append(f"{verb} {path}")
        handler.reply(403, _status(403, "Forbidden", f"{verb} {path} is forbidden: the Role grants list and watch "
                                                     "on agents and modelconfigs and patch on their status"))

    def _list(self, handler, namespace: str, plural: str) -> None:
        with self.cond:
            items = [copy.deepcopy(o) for (p, ns, _), o in sorted(self.objects.items()) if ns == namespace and p == plural]
            version = str(self.rv)
        kind = next(k for k, p in PLURALS.items() if p == plural)
        handler.reply(200, {"apiVersion": "agentmesh.dev/v1alpha1", "kind": f"{kind}List",
                            "metadata": {"resourceVersion": version}, "items": items})

    def _watch(self, handler, namespace: str, plural: str, since: int, timeout_s: float) -> None:
        with self.cond:
            self.watches += 1
        serve_watch(handler, self.cond,
                    lambda sent: [e[:4] for e in self.events if e[0] > sent and e[1] == namespace and e[4] == plural],
                    since, timeout_s, lambda: self.closed)

    def _patch_status(self, handler, namespace: str, name: str, plural: str = "agents") -> None:
        if handler.headers.get("Content-Type") != "application/merge-patch+json":
            handler.reply(415, _status(415, "UnsupportedMediaType", "the body of the request was in an unknown format"))
            return
        patch = handler.payload()
        with self.cond:
            current = self.objects.get((plural, namespace, name))
            if current is None:
                handler.reply(404, _status(404, "NotFound", f'{plural}.agentmesh.dev "{name}" not found'))
                return
            updated = copy.deepcopy(current)
            # The status subresource takes the status only; spec and metadata stay as they are.
            updated["status"] = merge_patch(current.get("status") or {}, patch.get("status") or {})
            try:
                jsonschema.validate(updated, self.schemas[plural])
            except jsonschema.ValidationError as exc:
                self.invalid.append(str(exc.message))
                handler.reply(422, _status(422, "Invalid", f"{current['kind']}.agentmesh.dev {name!r} is invalid: {exc.message}"))
                return
            self.status_writes.append((namespace, name))
            self._emit((plural, namespace, name), updated, "MODIFIED")
            body = copy.deepcopy(updated)
        handler.reply(200, body)
