"""The Lease API of fake_kube.py plus the agentmesh.dev group, as a cluster with the chart's CRDs
installed serves it: `Agent` resources over the real wire protocol — a list with its
resourceVersion, a watch streaming `{"type", "object"}` lines after a resourceVersion until
`timeoutSeconds`, and JSON merge patches of the status subresource (which never touch the spec
or the generation).

The API answers exactly what the chart's Role grants the scheduler in a managed namespace
(list and watch agents, patch agents/status) and 403 to the rest, recording it. The test plays
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


def agent_crd_schema() -> dict:
    from tests.helm.helm_support import render

    crd = render().get("CustomResourceDefinition", "agents.agentmesh.dev")
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


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
        self.schema = agent_crd_schema()
        self.agents: dict[tuple[str, str], dict] = {}
        self.events: list[tuple[int, str, str, dict]] = []  # (resourceVersion, namespace, type, object)
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
        jsonschema.validate(manifest, self.schema)  # the API server's CRD validation (422)
        meta = manifest["metadata"]
        key = (meta["namespace"], meta["name"])
        with self.cond:
            current = self.agents.get(key)
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

    def delete(self, namespace: str, name: str) -> None:
        with self.cond:
            obj = self.agents.pop((namespace, name))
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
            self.events.append((self.rv, namespace, "DELETED", copy.deepcopy(obj)))
            self.cond.notify_all()

    def get(self, namespace: str, name: str) -> dict:
        with self.cond:
            return copy.deepcopy(self.agents[(namespace, name)])

    def ready(self, namespace: str, name: str) -> dict | None:
        """The Ready condition of the resource's status, once written."""
        with self.cond:
            obj = self.agents.get((namespace, name)) or {}
            conditions = (obj.get("status") or {}).get("conditions") or []
            return next((dict(c) for c in conditions if c.get("type") == "Ready"), None)

    def _emit(self, key: tuple[str, str], obj: dict, kind: str) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        obj["metadata"]["namespace"] = key[0]
        obj.setdefault("apiVersion", "agentmesh.dev/v1alpha1")
        obj.setdefault("kind", "Agent")
        self.agents[key] = obj
        self.events.append((self.rv, key[0], kind, copy.deepcopy(obj)))
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
        parts = path[len(GROUP_PATH):].split("/")  # ns, agents[, name[, status]]
        watching = query.get("watch") in ("true", "1")
        if verb == "GET" and len(parts) == 2 and parts[1] == "agents":
            if watching:
                self._watch(handler, parts[0], int(query.get("resourceVersion") or 0),
                            float(query.get("timeoutSeconds") or 30))
            else:
                self._list(handler, parts[0])
            return
        if verb == "PATCH" and len(parts) == 4 and parts[1] == "agents" and parts[3] == "status":
            self._patch_status(handler, parts[0], parts[2])
            return
        self.forbidden.append(f"{verb} {path}")
        handler.reply(403, _status(403, "Forbidden", f"{verb} {path} is forbidden: the Role grants list and watch "
                                                     "on agents and patch on agents/status"))

    def _list(self, handler, namespace: str) -> None:
        with self.cond:
            items = [copy.deepcopy(o) for (ns, _), o in sorted(self.agents.items()) if ns == namespace]
            version = str(self.rv)
        handler.reply(200, {"apiVersion": "agentmesh.dev/v1alpha1", "kind": "AgentList",
                            "metadata": {"resourceVersion": version}, "items": items})

    def _watch(self, handler, namespace: str, since: int, timeout_s: float) -> None:
        with self.cond:
            self.watches += 1
        serve_watch(handler, self.cond, lambda sent: [e for e in self.events if e[0] > sent and e[1] == namespace],
                    since, timeout_s, lambda: self.closed)

    def _patch_status(self, handler, namespace: str, name: str) -> None:
        if handler.headers.get("Content-Type") != "application/merge-patch+json":
            handler.reply(415, _status(415, "UnsupportedMediaType", "the body of the request was in an unknown format"))
            return
        patch = handler.payload()
        with self.cond:
            current = self.agents.get((namespace, name))
            if current is None:
                handler.reply(404, _status(404, "NotFound", f'agents.agentmesh.dev "{name}" not found'))
                return
            updated = copy.deepcopy(current)
            # The status subresource takes the status only; spec and metadata stay as they are.
            updated["status"] = merge_patch(current.get("status") or {}, patch.get("status") or {})
            try:
                jsonschema.validate(updated, self.schema)
            except jsonschema.ValidationError as exc:
                handler.reply(422, _status(422, "Invalid", f"Agent.agentmesh.dev {name!r} is invalid: {exc.message}"))
                return
            self.status_writes.append((namespace, name))
            self._emit((namespace, name), updated, "MODIFIED")
            body = copy.deepcopy(updated)
        handler.reply(200, body)
