"""Render the agentmesh chart with Helm's own Go SDK (helm-python-sdk) and read the result.

No helm binary and no cluster: `helm_python` binds libhelm_c, which renders exactly as
`helm template` does (schema validation and `fail` included).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import helm_python
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "helm" / "agentmesh"
PRODUCTION_VALUES = CHART / "examples" / "values-production.yaml"
RELEASE = "agentmesh"
NAMESPACE = "agentmesh"
SERVICES = ("gateway", "agent", "tools", "memory", "scheduler")
PORTS = {"gateway": 50051, "agent": 50052, "tools": 50053, "memory": 50054, "scheduler": 50055}
# libyaml's safe loader where PyYAML has it (the same documents, a tenth of the CPU): the chart
# tests parse a render of ~50 objects some 65 times per run.
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_values(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text()) or {}


def render_files(values: dict[str, Any] | None = None, *, namespace: str = NAMESPACE) -> dict[str, str]:
    """Template path -> rendered text, like `helm template`. Raises helm_python.HelmError."""
    with helm_python.Chart.load(str(CHART)) as chart:
        return chart.render(values or {}, name=RELEASE, namespace=namespace, is_install=True)


@dataclass
class Rendered:
    files: dict[str, str]
    objects: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def of(cls, files: dict[str, str]) -> "Rendered":
        objects = []
        for path, text in sorted(files.items()):
            if path.endswith("NOTES.txt"):
                continue
            objects.extend(doc for doc in yaml.load_all(text, Loader=SAFE_LOADER) if doc)
        return cls(files, objects)

    @property
    def notes(self) -> str:
        return next(text for path, text in self.files.items() if path.endswith("NOTES.txt"))

    def kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        matches = [o for o in self.kind(kind) if o["metadata"]["name"] == name]
        assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
        return matches[0]

    def find(self, kind: str, name: str) -> dict[str, Any] | None:
        matches = [o for o in self.kind(kind) if o["metadata"]["name"] == name]
        return matches[0] if matches else None

    def deployment(self, service: str) -> dict[str, Any]:
        return self.get("Deployment", f"{RELEASE}-{service}")

    def workloads(self) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob")]

    def config(self) -> dict[str, str]:
        return self.get("ConfigMap", f"{RELEASE}-config")["data"]


def render(values: dict[str, Any] | None = None, *, namespace: str = NAMESPACE) -> Rendered:
    return Rendered.of(render_files(values, namespace=namespace))


def container_env(container: dict[str, Any]) -> dict[str, Any]:
    """name -> value, or name -> valueFrom dict."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


# ---------------------------------------------------------------------------------------------
# A NetworkPolicy evaluator, so tests can ask "may A open a connection to B on port P?" of the
# rendered policies, following the Kubernetes semantics: a pod selected by no policy of a
# direction is open in that direction; a selected pod admits only what some rule allows; a
# connection needs both the source's egress and the destination's ingress to allow it.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    name: str
    namespace: str | None = None  # None: outside the cluster (ip only)
    labels: tuple[tuple[str, str], ...] = ()
    namespace_labels: tuple[tuple[str, str], ...] = ()
    ip: str = "10.244.0.10"

    @property
    def label_map(self) -> dict[str, str]:
        return dict(self.labels)

    @property
    def is_pod(self) -> bool:
        return self.namespace is not None


def pod(name: str, namespace: str, labels: dict[str, str], ip: str = "10.244.0.10") -> Endpoint:
    return Endpoint(
        name,
        namespace,
        tuple(sorted(labels.items())),
        (("kubernetes.io/metadata.name", namespace),),
        ip,
    )


def external(name: str, ip: str) -> Endpoint:
    return Endpoint(name, None, ip=ip)


def _selects(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    selector = selector or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def _peer_matches(peer: dict[str, Any], policy_ns: str, other: Endpoint) -> bool:
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        ip = ipaddress.ip_address(other.ip)
        if ip not in ipaddress.ip_network(block["cidr"]):
            return False
        return not any(ip in ipaddress.ip_network(e) for e in block.get("except") or [])
    if not other.is_pod:
        return False
    if "namespaceSelector" in peer:
        if not _selects(peer["namespaceSelector"], dict(other.namespace_labels)):
            return False
    elif other.namespace != policy_ns:
        return False
    if "podSelector" in peer:
        return _selects(peer["podSelector"], other.label_map)
    return True


def _port_matches(ports: list[dict[str, Any]] | None, port: int, protocol: str) -> bool:
    if not ports:
        return True
    for p in ports:
        if p.get("protocol", "TCP") != protocol:
            continue
        if "port" not in p:
            return True
        if p["port"] == port or (p.get("endPort") and p["port"] <= port <= p["endPort"]):
            return True
    return False


def _direction_allows(policies: Iterable[dict[str, Any]], subject: Endpoint, other: Endpoint,
                      direction: str, port: int, protocol: str) -> bool:
    """Whether policies on `subject` let traffic to (egress) / from (ingress) `other` through."""
    if not subject.is_pod:
        return True  # nothing outside the cluster is policed here
    rule_key, peer_key = ("egress", "to") if direction == "Egress" else ("ingress", "from")
    selecting = [
        p for p in policies
        if p["metadata"]["namespace"] == subject.namespace
        and direction in p["spec"].get("policyTypes", ["Ingress"])
        and _selects(p["spec"].get("podSelector"), subject.label_map)
    ]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get(rule_key) or []:
            peers = rule.get(peer_key)
            if peers and not any(_peer_matches(peer, subject.namespace, other) for peer in peers):
                continue
            if _port_matches(rule.get("ports"), port, protocol):
                return True
    return False


def allowed(policies: list[dict[str, Any]], src: Endpoint, dst: Endpoint, port: int, protocol: str = "TCP") -> bool:
    return _direction_allows(policies, src, dst, "Egress", port, protocol) and _direction_allows(
        policies, dst, src, "Ingress", port, protocol
    )
