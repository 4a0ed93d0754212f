"""Configuration: one typed tree, built once from the environment at start-up and passed down.

Each setting is declared once, beside its field, with `env(...)`: the variable's name, its
default, its bounds or choices, whether it is a secret. The field's type says how the value
is parsed. One loader, `load`, reads any such dataclass:

    @dataclass(frozen=True)
    class ToolsSettings(EnvSection):
        max_file_read_bytes: int = env("AGENTMESH_TOOLS_MAX_FILE_READ_BYTES", 256 * 1024, minimum=1)
        limits: SandboxLimits = section(SandboxLimits)

Rules that involve several fields (one must be longer than another, a default that depends on
another variable) live in the section's `__post_init__` and raise `ConfigError`.

`Settings.from_env()` builds the whole tree: the settings every service shares, the telemetry
section, and each service's own section (`agentmesh.<service>.settings`), so one malformed
variable stops any service at start-up with a sentence naming it. Code below the entry point
receives typed objects (`settings.section(AgentSettings)`), never the environment.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar

from agentmesh.errors import ConfigError
from agentmesh.models import load_model_file
from agentmesh.secret_fields import SECRET, secret_field
from agentmesh.tenancy import AuthPolicy, load_policy_file

__all__ = [
    "DEFAULT_PORTS",
    "SERVICES",
    "SERVICE_SECTIONS",
    "ConfigError",
    "EnvSection",
    "EnvVar",
    "LLMSettings",
    "OtlpExporterSettings",
    "RpcServerSettings",
    "ServiceAddresses",
    "Settings",
    "TelemetrySettings",
    "declared_variables",
    "env",
    "load",
    "referenced_environment",
    "secret_field",
    "secret_values",
    "section",
    "section_class",
]

T = TypeVar("T")

SERVICES = ("gateway", "agent", "tools", "memory", "scheduler")

DEFAULT_PORTS = {
    "gateway": 50051,
    "agent": 50052,
    "tools": 50053,
    "memory": 50054,
    "scheduler": 50055,
}

# Each service's own section, loaded with the rest of the tree (imported by name: the shared
# library does not depend on the services, the same way `rpc.launch` finds their servers).
SERVICE_SECTIONS = {
    "gateway": "agentmesh.gateway.settings:GatewaySettings",
    "agent": "agentmesh.agent.settings:AgentSettings",
    "tools": "agentmesh.tools.settings:ToolsSettings",
    "memory": "agentmesh.memory.settings:MemorySettings",
    "scheduler": "agentmesh.scheduler.settings:SchedulerSettings",
}

_VAR = "agentmesh.config.var"
_SECTION = "agentmesh.config.section"
_ENVIRON = "agentmesh.config.environ"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class EnvVar:
    """What `env(...)` records about one variable; `declared_variables` lists them for the docs."""

    name: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    secret: bool = False
    # Custom parsing for types the loader does not know (raise ValueError with the reason).
    parse: Callable[..., Any] | None = None
    # The variable counts in this unit (e.g. MiB for a *_MB variable); the field holds the product.
    unit: int = 1
    # `parse` also takes the environment: a value that names other variables (a key reference).
    parse_environ: bool = False


def env(
    name: str,
    default: Any = MISSING,
    *,
    default_factory: Callable[[], Any] | Any = MISSING,
    minimum: float | None = None,
    maximum: float | None = None,
    choices: tuple[str, ...] = (),
    secret: bool = False,
    parse: Callable[..., Any] | None = None,
    unit: int = 1,
    parse_environ: bool = False,
) -> Any:
    """A dataclass field read from the variable `name` (unset or blank: the default). With
    `unit`, the variable is given in that unit and bounded in it; the field holds the product."""
    var = EnvVar(name, minimum, maximum, tuple(choices), secret, parse, unit, parse_environ)
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata={_VAR: var}, repr=not secret)
    return field(default=default, metadata={_VAR: var}, repr=not secret)


def section(kind: type[T], *, prefix: str = "") -> T:
    """A nested section, loaded with its parent; `prefix` is put before its variables' names."""
    return field(default_factory=kind, metadata={_SECTION: prefix})


def referenced_environment(prefix: str) -> Any:
    """A field holding the variables whose names start with `prefix`, for settings that name
    variables at run time (an MCP server entry's `${AGENTMESH_MCP_SECRET_...}` references).
    Only that family is kept, never the rest of the environment; never printed."""
    return field(default_factory=dict, metadata={_ENVIRON: prefix}, repr=False, compare=False)


# Resolving a dataclass's string annotations evaluates each of them: a few milliseconds per class,
# and every service start, CLI command and `Settings.from_env` loads the whole tree. Once per class.
_HINTS: dict[type, dict[str, Any]] = {}


def _type_hints(kind: type) -> dict[str, Any]:
    hints = _HINTS.get(kind)
    if hints is None:
        hints = _HINTS[kind] = typing.get_type_hints(kind)
    return hints


def load(kind: type[T], environ: Mapping[str, str], prefix: str = "") -> T:
    """An instance of the dataclass `kind` with every declared variable read from `environ`."""
    hints = _type_hints(kind)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(kind):  # type: ignore[arg-type]  # `kind` is a dataclass
        var: EnvVar | None = f.metadata.get(_VAR)
        if var is not None:
            name = prefix + var.name
            raw = environ.get(name, "").strip()
            if raw:
                values[f.name] = _parse(name, var, hints[f.name], raw, environ)
        elif _SECTION in f.metadata:
            values[f.name] = load(hints[f.name], environ, prefix + f.metadata[_SECTION])
        elif f.metadata.get(_ENVIRON):
            family = f.metadata[_ENVIRON]
            values[f.name] = {name: value for name, value in environ.items() if name.startswith(family)}
    return kind(**values)


def declared_variables(kind: type, prefix: str = "") -> Iterator[tuple[str, EnvVar, dataclasses.Field[Any]]]:
    """(full name, declaration, field) of every variable `kind` and its sections read."""
    hints = _type_hints(kind)
    for f in dataclasses.fields(kind):
        if _VAR in f.metadata:
            yield prefix + f.metadata[_VAR].name, f.metadata[_VAR], f
        elif _SECTION in f.metadata:
            yield from declared_variables(hints[f.name], prefix + f.metadata[_SECTION])



def secret_values(tree: Any) -> list[str]:
    """Every non-empty value of a field declared `secret=True`, anywhere in a loaded tree."""
    found: list[str] = []
    if not dataclasses.is_dataclass(tree):
        return found
    for f in dataclasses.fields(tree):
        value = getattr(tree, f.name)
        var = f.metadata.get(_VAR)
        if (var is not None and var.secret) or f.metadata.get(SECRET):
            found += [str(v) for v in value] if isinstance(value, (tuple, frozenset, list)) else [str(value)]
        elif isinstance(value, Mapping):
            for item in value.values():
                found += secret_values(item)
        else:
            found += secret_values(value)
    return [s for s in found if s]


class EnvSection:
    """Gives a settings dataclass `from_env(environ)`, the loader applied to it."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Self:
        return load(cls, environ)


def _parse(name: str, var: EnvVar, kind: Any, raw: str, environ: Mapping[str, str] | None = None) -> Any:
    if var.parse is not None:
        try:
            return var.parse(raw, environ or {}) if var.parse_environ else var.parse(raw)
        except ConfigError:
            raise
        except ValueError as exc:
            raise ConfigError(f"{name}: {exc}") from None
    kind = _without_none(kind)
    origin = typing.get_origin(kind)
    if origin in (tuple, frozenset):
        items = (item.strip() for item in raw.split(","))
        return origin(item for item in items if item)
    if kind is bool:
        if raw.lower() in _TRUE:
            return True
        if raw.lower() in _FALSE:
            return False
        raise ConfigError(f"{name} must be true or false, got {raw!r}")
    if kind is int or kind is float:
        try:
            number = kind(raw)
        except ValueError:
            what = "a whole number" if kind is int else "a number"
            raise ConfigError(f"{name} must be {what}, got {raw!r}") from None
        if var.minimum is not None and number < var.minimum:
            raise ConfigError(f"{name} must be at least {_plain(var.minimum)}, got {number}")
        if var.maximum is not None and number > var.maximum:
            raise ConfigError(f"{name} must be at most {_plain(var.maximum)}, got {number}")
        return number * var.unit
    if kind is Path:
        return Path(raw).expanduser()
    if var.choices:
        if raw.lower() not in var.choices:
            raise ConfigError(f"{name} must be one of {', '.join(var.choices)}; got {raw.lower()!r}")
        return raw.lower()
    return raw


def _without_none(kind: Any) -> Any:
    """`float | None` -> `float` (unset stays the default, None)."""
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        rest = [arg for arg in typing.get_args(kind) if arg is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return kind


def _plain(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else str(number)


def _load_models(path: str, environ: Mapping[str, str]) -> Any:
    return load_model_file(path, environ)


# --- the settings every service shares -------------------------------------------------------


@dataclass(frozen=True)
class LLMSettings(EnvSection):
    """The model endpoint. `base_url` and `model` keep whether they were named ("" = not):
    each provider has its own default URL, and a scripted demo does not claim a real model."""

    DEFAULT_BASE_URL: ClassVar[str] = "http://localhost:11434/v1"
    # The model id asked of an OpenAI-compatible server when AGENTMESH_LLM_MODEL names none (not
    # `agentmesh.models.DEFAULT_MODEL`, the catalogue's name for this whole model entry).
    MODEL_ID_WHEN_UNNAMED: ClassVar[str] = "llama3.1"

    # "" = by the base URL: "openai" when one is named, else the offline "scripted" provider.
    provider: str = env("AGENTMESH_LLM_PROVIDER", "", choices=("openai", "anthropic", "scripted"))
    base_url: str = env("AGENTMESH_LLM_BASE_URL", "")
    api_key: str = env("AGENTMESH_LLM_API_KEY", "", secret=True)
    model: str = env("AGENTMESH_LLM_MODEL", "")
    timeout_s: float = env("AGENTMESH_LLM_TIMEOUT_S", 120.0, minimum=1)
    max_retries: int = env("AGENTMESH_LLM_MAX_RETRIES", 4, minimum=0)
    # Calls to this model at once; more wait for a slot, visibly (a status event, metrics). Also
    # the default of every AGENTMESH_MODELS entry without its own `max_concurrency`. 0: no limit.
    max_concurrency: int = env("AGENTMESH_LLM_MAX_CONCURRENCY", 1024, minimum=0, maximum=1_000_000)
    # Whether the AGENTMESH_LLM_* model takes images (a catalogue entry's `vision`); false: each
    # image reaches it as one line of text.
    vision: bool = env("AGENTMESH_LLM_VISION", True)
    script_path: str = env("AGENTMESH_LLM_SCRIPT", "")  # scripted provider; "" = the built-in demo
    # Its prices per million tokens, for cost estimates (Gateway.GetUsage); 0: not configured.
    input_price_per_mtok: float = env("AGENTMESH_LLM_INPUT_PRICE_PER_MTOK", 0.0, minimum=0)
    output_price_per_mtok: float = env("AGENTMESH_LLM_OUTPUT_PRICE_PER_MTOK", 0.0, minimum=0)
    # Its context window in tokens, like a catalogue entry's `context_window`; 0: unknown (the
    # agent then assumes AGENTMESH_AGENT_CONTEXT_WINDOW).
    context_window: int = env("AGENTMESH_LLM_CONTEXT_WINDOW", 0, minimum=0)
    # More models by name (agentmesh.models), beside this one as "default"; keys resolved here.
    models: Any = env("AGENTMESH_MODELS", default_factory=dict, parse=_load_models,
                      parse_environ=True)
    # Which catalogue model writes compaction summaries ("": the model the turn talks to) and
    # which reflects on sessions ("": the session's own model); `agentmesh models` shows the roles.
    compaction_model: str = env("AGENTMESH_COMPACTION_MODEL", "")
    reflection_model: str = env("AGENTMESH_REFLECTION_MODEL", "")

    def __post_init__(self) -> None:
        object.__setattr__(self, "base_url", self.base_url.rstrip("/"))
        if not self.provider:
            object.__setattr__(self, "provider", "openai" if self.base_url else "scripted")
        for variable, name in (("AGENTMESH_COMPACTION_MODEL", self.compaction_model),
                               ("AGENTMESH_REFLECTION_MODEL", self.reflection_model)):
            if name and name != "default" and name not in self.models:  # a typo must not wait for first use
                known = ", ".join(["default", *sorted(self.models)])
                raise ConfigError(f"{variable}: {name[:80]!r} is not a model this deployment offers; known models: {known}")

    @property
    def endpoint(self) -> str:
        """The base URL to use with an OpenAI-compatible server."""
        return self.base_url or self.DEFAULT_BASE_URL

    @property
    def model_name(self) -> str:
        """The model requests name: the configured one; for the scripted provider "scripted"
        unless one was named, so that traces of a demo do not claim a real model answered."""
        if self.model:
            return self.model
        return "scripted" if self.provider == "scripted" else self.MODEL_ID_WHEN_UNNAMED


@dataclass(frozen=True)
class OtlpExporterSettings:
    """The standard OTEL_EXPORTER_OTLP_[SIGNAL_]* variables; unset per-signal ones fall back
    to the general ones (see `TelemetrySettings.otlp`)."""

    endpoint: str = env("ENDPOINT", "")
    protocol: str = env("PROTOCOL", "", choices=("grpc", "http/protobuf"))
    headers: str = env("HEADERS", "", secret=True)
    insecure: bool | None = env("INSECURE", None)
    timeout_ms: float | None = env("TIMEOUT", None, minimum=0)


@dataclass(frozen=True)
class TelemetrySettings:
    traces_retention_days: float = env("AGENTMESH_TRACES_RETENTION_DAYS", 7.0, minimum=0.01)
    traces_max_mb: int = env("AGENTMESH_TRACES_MAX_MB", 64, minimum=1)
    metric_export_interval_ms: int = env("OTEL_METRIC_EXPORT_INTERVAL", 60_000, minimum=100)
    sampler: str = env(
        "OTEL_TRACES_SAMPLER",
        "parentbased_always_on",
        choices=("always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off",
                 "parentbased_traceidratio"),
    )
    sampler_arg: float = env("OTEL_TRACES_SAMPLER_ARG", 1.0, minimum=0.0)
    # Off by default: with the SDK's default (`trace_based`) every measurement made inside a
    # sampled span offers an exemplar, which triples what recording one costs (48 vs 17 µs).
    exemplar_filter: str = env("OTEL_METRICS_EXEMPLAR_FILTER", "always_off",
                               choices=("always_off", "always_on", "trace_based"))
    resource_attributes: str = env("OTEL_RESOURCE_ATTRIBUTES", "")
    otlp_general: OtlpExporterSettings = section(OtlpExporterSettings, prefix="OTEL_EXPORTER_OTLP_")
    otlp_traces: OtlpExporterSettings = section(OtlpExporterSettings, prefix="OTEL_EXPORTER_OTLP_TRACES_")
    otlp_metrics: OtlpExporterSettings = section(OtlpExporterSettings, prefix="OTEL_EXPORTER_OTLP_METRICS_")

    def otlp(self, signal: str) -> OtlpExporterSettings:
        """The exporter settings for "traces" or "metrics": the signal's own, else the general."""
        own = self.otlp_traces if signal == "traces" else self.otlp_metrics
        general = self.otlp_general
        return OtlpExporterSettings(
            endpoint=own.endpoint or general.endpoint,
            protocol=own.protocol or general.protocol or "grpc",
            headers=own.headers or general.headers,
            insecure=own.insecure if own.insecure is not None else general.insecure,
            timeout_ms=own.timeout_ms if own.timeout_ms is not None else general.timeout_ms,
        )


@dataclass(frozen=True)
class ServiceAddresses:
    gateway: str = env("AGENTMESH_GATEWAY_ADDR", f"127.0.0.1:{DEFAULT_PORTS['gateway']}")
    agent: str = env("AGENTMESH_AGENT_ADDR", f"127.0.0.1:{DEFAULT_PORTS['agent']}")
    tools: str = env("AGENTMESH_TOOLS_ADDR", f"127.0.0.1:{DEFAULT_PORTS['tools']}")
    memory: str = env("AGENTMESH_MEMORY_ADDR", f"127.0.0.1:{DEFAULT_PORTS['memory']}")
    scheduler: str = env("AGENTMESH_SCHEDULER_ADDR", f"127.0.0.1:{DEFAULT_PORTS['scheduler']}")


@dataclass(frozen=True)
class RpcServerSettings:
    """How every service's gRPC server treats its connections (docs/security.md, slow and idle
    clients): a connection is closed once it has carried no call for `idle_s` (clients open a
    new one on their next call), and one that has not finished its HTTP/2 handshake in
    `handshake_timeout_s`. Dead peers are found by keepalive pings (30 s, 20 s to answer)."""

    idle_s: float = env("AGENTMESH_GRPC_MAX_CONNECTION_IDLE_S", 300.0, minimum=1)
    handshake_timeout_s: float = env("AGENTMESH_GRPC_HANDSHAKE_TIMEOUT_S", 10.0, minimum=0.1)


def _default_home() -> Path:
    return Path.home() / ".agentmesh"


@dataclass(frozen=True)
class Settings:
    """What every service knows: where data lives, where its peers are, how to report; and,
    loaded with it, each service's own section (`section(AgentSettings)`)."""

    home: Path = env("AGENTMESH_HOME", default_factory=_default_home)
    service_addresses: ServiceAddresses = section(ServiceAddresses)
    rpc_server: RpcServerSettings = section(RpcServerSettings)
    # By service name; from `service_addresses` unless given (tests point it at their ports).
    addresses: Mapping[str, str] = field(default_factory=dict)
    llm: LLMSettings = section(LLMSettings)
    telemetry: TelemetrySettings = section(TelemetrySettings)
    sandbox: str = env("AGENTMESH_SANDBOX", "local", choices=("local", "kubernetes"))
    qdrant_url: str = env("AGENTMESH_QDRANT_URL", "")
    log_level: str = env("AGENTMESH_LOG_LEVEL", "info", choices=("debug", "info", "warning", "error"))
    # Address a service binds to; defaults to its entry in `addresses`.
    listen_address: str = env("AGENTMESH_LISTEN_ADDR", "")
    # Shutdown grace: how long in-flight RPCs may run on SIGTERM before they are cancelled.
    drain_s: float = env("AGENTMESH_DRAIN_S", 20.0, minimum=0)
    # Gateway bearer tokens; empty disables authentication (local default).
    auth_tokens: tuple[str, ...] = env("AGENTMESH_AUTH_TOKENS", (), secret=True)
    # The token the CLI presents when authentication is on (services sign their own calls).
    client_token: str = env("AGENTMESH_AUTH_TOKEN", "", secret=True)
    # Tenants, their namespaces and members, service accounts, OIDC (docs/security.md): a YAML
    # or JSON file. Unset: one tenant owns every namespace (AGENTMESH_AUTH_TOKENS are its admins).
    # Where `agentmesh login` keeps the user's token (mode 0600); AGENTMESH_AUTH_TOKEN wins over it.
    credentials_file: Path = env("AGENTMESH_CREDENTIALS_FILE",
                                 default_factory=lambda: Path.home() / ".config" / "agentmesh" / "credentials")
    # Namespaces whose named agents are defined by Kubernetes `Agent` resources (docs/agents.md):
    # the scheduler's leader syncs them, and the gateway refuses agent changes through the API there.
    managed_agent_namespaces: tuple[str, ...] = env("AGENTMESH_MANAGED_AGENT_NAMESPACES", ())
    # The audit log (docs/security.md): a file of JSON lines; empty: the service's own log.
    audit_log: str = env("AGENTMESH_AUDIT_LOG", "")
    auth_policy_file: AuthPolicy = env("AGENTMESH_AUTH_POLICY", default_factory=AuthPolicy, parse=load_policy_file)
    # Each service's signing key and its peers' public keys (docs/security.md); empty: home/keys.
    service_keys_dir: str = env("AGENTMESH_SERVICE_KEYS_DIR", "")
    # Tracing: "local" keeps spans under home; "otlp" exports; "none" disables.
    # "" = "otlp" when an OTLP endpoint is configured, else "local".
    traces: str = env("AGENTMESH_TRACES", "", choices=("local", "otlp", "none"))
    # Service name -> that service's section, as loaded by `from_env`.
    sections: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.addresses:
            object.__setattr__(self, "addresses", dataclasses.asdict(self.service_addresses))
        if not self.traces:
            endpoint = self.telemetry.otlp_general.endpoint or self.telemetry.otlp_traces.endpoint
            object.__setattr__(self, "traces", "otlp" if endpoint else "local")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The whole tree from `environ` (default: the process environment)."""
        environ = dict(os.environ if environ is None else environ)
        settings = load(cls, environ)
        sections: dict[str, Any] = {name: load(section_class(name), environ) for name in SERVICE_SECTIONS}
        return dataclasses.replace(settings, sections=sections)

    def section(self, kind: type[T]) -> T:
        """This service's own settings, e.g. `settings.section(AgentSettings)`, as `from_env`
        loaded them. A tree without it (a `Settings(...)` made by hand) is a mistake, not a reason
        to run on defaults that ignore the environment: ConfigError saying so."""
        for value in self.sections.values():
            if isinstance(value, kind):
                return value
        loaded = ", ".join(type(value).__name__ for value in self.sections.values()) or "none"
        raise ConfigError(
            f"these settings hold no {kind.__name__} section (loaded: {loaded}); build them with "
            "Settings.from_env(), which loads every service's section, rather than Settings(...)"
        )

    @property
    def keys_dir(self) -> Path:
        return Path(self.service_keys_dir).expanduser() if self.service_keys_dir else self.home / "keys"

    @property
    def auth_policy(self) -> AuthPolicy:
        """Who may sign in and what they may do: the policy file with AGENTMESH_AUTH_TOKENS."""
        return self.auth_policy_file.with_static_tokens(self.auth_tokens)

    def address_of(self, service: str) -> str:
        return self.addresses[service]

    def bind_address(self, service: str) -> str:
        """Where `service` listens: AGENTMESH_LISTEN_ADDR, else the port of its own address on all interfaces."""
        if self.listen_address:
            return self.listen_address
        own = self.addresses[service]
        host, _, port = own.rpartition(":")
        if host in ("127.0.0.1", "localhost", "[::1]"):
            return own
        return f"0.0.0.0:{port}"


def section_class(service: str) -> type:
    """The settings class of `service`, e.g. `AgentSettings` for "agent"."""
    module, _, name = SERVICE_SECTIONS[service].partition(":")
    kind: type = getattr(importlib.import_module(module), name)
    return kind
