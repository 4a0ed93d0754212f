"""Sandbox templates: named kinds of sandbox a deployment offers (image, CPU, memory, disk quota,
runtime class, network, isolation), chosen per namespace, session or agent (docs/tools.md#sandbox-templates).

The deployment defines them in a file (`AGENTMESH_SANDBOX_TEMPLATES`, YAML or JSON; the chart
writes it from `sandbox.templates`). `default` always exists and is today's sandbox, built from
the other settings; a template's field left out is the default template's. Plain data, no I/O
beyond reading the file: the local jail and the Kubernetes executors both read these values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Mapping

from agentmesh.errors import ConfigError

__all__ = [
    "DEFAULT_TEMPLATE",
    "ISOLATIONS",
    "NETWORKS",
    "SandboxTemplate",
    "TemplateSet",
    "cpu_quantity",
    "load_templates_file",
    "parse_templates",
    "quantity_bytes",
]

DEFAULT_TEMPLATE = "default"
NETWORKS = ("none", "egress")
ISOLATIONS = ("call", "session")
NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_UNITS = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_CPU = re.compile(r"^([0-9]+(?:\.[0-9]+)?|[0-9]+m)$")


def quantity_bytes(text: str) -> int:
    """A Kubernetes memory/storage quantity ("512Mi", "2Gi", "1G", "1048576") in bytes."""
    match = _QUANTITY.match(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a size such as 512Mi, 2Gi or 1G")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def cpu_quantity(text: str) -> str:
    """A Kubernetes CPU quantity ("500m", "1", "1.5"), checked and returned as written."""
    if not _CPU.match(text.strip()) or float(text.strip().rstrip("m") or 0) <= 0:
        raise ValueError(f"{text!r} is not a CPU amount such as 500m, 1 or 2")
    return text.strip()


@dataclass(frozen=True)
class SandboxTemplate:
    """One kind of sandbox. Sizes are Kubernetes quantities: a pod gets them as its resources;
    the local jail holds to `memory` (its processes and tmpfs together) and `disk_quota` (the
    session workspace), and has no CPU-share or image of its own (it runs the host's system)."""

    name: str
    image: str = ""  # the container image of a pod; the local jail ignores it
    cpu: str = ""  # a pod's CPU limit, e.g. "1"
    memory: str = ""  # e.g. "1Gi"
    disk_quota: str = ""  # the session workspace's quota, e.g. "1Gi"
    runtime_class: str = ""  # a pod's runtimeClassName (gVisor, Kata); "" none
    network: str = "none"  # "none" | "egress": the internet, never the host or private ranges
    isolation: str = "call"  # "call": a fresh sandbox per call | "session": one per session
    # In a cluster running agent-sandbox: the SandboxWarmPool its session sandboxes are claimed
    # from (agent_sandbox.py) instead of pods of our own; "" none.
    agent_sandbox_pool: str = ""
    description: str = ""

    @property
    def memory_bytes(self) -> int:
        return quantity_bytes(self.memory)

    @property
    def disk_quota_bytes(self) -> int:
        return quantity_bytes(self.disk_quota)

    @property
    def egress(self) -> bool:
        return self.network == "egress"

    def as_dict(self) -> dict[str, str]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


_KEYS = tuple(f.name for f in fields(SandboxTemplate) if f.name != "name")
# The file may also say it the chart's way.
_ALIASES = {"runtimeClass": "runtime_class", "runtimeClassName": "runtime_class", "diskQuota": "disk_quota",
            "agentSandboxPool": "agent_sandbox_pool"}


def _template(name: str, entry: Any, where: str) -> dict[str, str]:
    if not isinstance(name, str) or not NAME.match(name):
        raise ConfigError(f"{where}: template name {name!r} must be 1-63 lower-case letters, digits or '-'")
    if entry is None:
        entry = {}
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where}: template {name!r} must be a mapping of its fields ({', '.join(_KEYS)})")
    values: dict[str, str] = {}
    for key, value in entry.items():
        field_name = _ALIASES.get(key, key)
        if field_name not in _KEYS:
            raise ConfigError(f"{where}: template {name!r} has an unknown field {key!r}; the fields are {', '.join(_KEYS)}")
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"{where}: template {name!r}: {key} must be a string, got {value!r}")
        values[field_name] = str(value).strip()
    try:
        if "memory" in values:
            quantity_bytes(values["memory"])
        if "disk_quota" in values:
            quantity_bytes(values["disk_quota"])
        if "cpu" in values:
            cpu_quantity(values["cpu"])
    except ValueError as exc:
        raise ConfigError(f"{where}: template {name!r}: {exc}") from None
    if values.get("agent_sandbox_pool") and not NAME.match(values["agent_sandbox_pool"]):
        raise ConfigError(f"{where}: template {name!r}: agent_sandbox_pool must name a SandboxWarmPool (lower-case "
                          f"letters, digits or '-'), got {values['agent_sandbox_pool']!r}")
    for key, allowed in (("network", NETWORKS), ("isolation", ISOLATIONS)):
        if key in values and values[key] not in allowed:
            raise ConfigError(f"{where}: template {name!r}: {key} must be {' or '.join(allowed)}, got {values[key]!r}")
    return values


def parse_templates(text: str, source: str = "the templates file") -> tuple[tuple[str, dict[str, str]], ...]:
    """The file's templates as (name, the fields it sets): `{"templates": {NAME: {...}}}` or the
    mapping of names itself. What it leaves out is filled from `default` (TemplateSet)."""
    # Imported here: every process loads the settings, few name a templates file.
    import yaml  # type: ignore[import-untyped]  # PyYAML ships no type hints

    try:
        raw = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source} is neither YAML nor JSON: {exc}") from None
    raw = raw or {}
    if isinstance(raw, Mapping) and set(raw) == {"templates"}:
        raw = raw["templates"] or {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source} must map template names to their fields, e.g. {{\"data\": {{\"memory\": \"2Gi\"}}}}")
    return tuple((name, _template(name, entry, source)) for name, entry in raw.items())


def load_templates_file(path: str) -> tuple[tuple[str, dict[str, str]], ...]:
    """Parse for the AGENTMESH_SANDBOX_TEMPLATES setting: a file path (YAML or JSON)."""
    where = Path(path).expanduser()
    try:
        text = where.read_text()
    except OSError as exc:
        raise ConfigError(f"AGENTMESH_SANDBOX_TEMPLATES: cannot read {where}: {exc.strerror}") from None
    return parse_templates(text, str(where))


class TemplateSet:
    """The deployment's templates by name: `default` (from the other settings, or as the file
    overrides it) and the file's, each with what it leaves out taken from `default`."""

    def __init__(self, default: SandboxTemplate, declared: tuple[tuple[str, dict[str, str]], ...] = ()):
        own = dict(declared)
        base = replace(default, **own.pop(DEFAULT_TEMPLATE, {}))
        self._templates = {DEFAULT_TEMPLATE: base}
        for name, values in own.items():
            self._templates[name] = replace(base, **{"name": name, "description": "", **values})
        for template in self._templates.values():
            if template.agent_sandbox_pool and template.isolation != "session":
                raise ConfigError(f"sandbox template {template.name!r}: agent_sandbox_pool gives session sandboxes; "
                                  "set isolation: session with it")

    @property
    def default(self) -> SandboxTemplate:
        return self._templates[DEFAULT_TEMPLATE]

    def names(self) -> list[str]:
        return list(self._templates)

    def all(self) -> list[SandboxTemplate]:
        return list(self._templates.values())

    def get(self, name: str) -> SandboxTemplate | None:
        """The template called `name` ("" is `default`); None when there is none."""
        return self._templates.get(name or DEFAULT_TEMPLATE)

    def unknown_detail(self, name: str) -> str:
        return (f"there is no sandbox template {name!r}; this deployment has {', '.join(self.names())} "
                "(agentmesh sandbox templates; the deployment defines them in AGENTMESH_SANDBOX_TEMPLATES)")
