"""Configuration shared by every service, built once from the environment at start-up.

Each service builds a `Settings` in its entry point and passes it down; nothing reads the
environment after that. Service-specific knobs live in a section class inside the service
package (for example `agentmesh.tools.settings.ToolsSettings`), built from the same mapping.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

SERVICES = ("gateway", "agent", "tools", "memory", "scheduler")

DEFAULT_PORTS = {
    "gateway": 50051,
    "agent": 50052,
    "tools": 50053,
    "memory": 50054,
    "scheduler": 50055,
}


class ConfigError(ValueError):
    """A setting in the environment is missing or malformed; the message names it."""


def env_str(env: Mapping[str, str], name: str, default: str = "") -> str:
    value = env.get(name, "")
    return value.strip() if value.strip() else default


def env_int(env: Mapping[str, str], name: str, default: int, *, minimum: int | None = None) -> int:
    raw = env_str(env, name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value}")
    return value


def env_float(env: Mapping[str, str], name: str, default: float, *, minimum: float | None = None) -> float:
    raw = env_str(env, name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value}")
    return value


def env_bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env_str(env, name).lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name} must be true or false, got {raw!r}")


def env_choice(env: Mapping[str, str], name: str, default: str, choices: tuple[str, ...]) -> str:
    value = env_str(env, name, default).lower()
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
    return value


@dataclass(frozen=True)
class LLMSettings:
    provider: str = "scripted"
    base_url: str = "http://localhost:11434/v1"
    api_key: str = field(default="", repr=False)  # never printed
    model: str = "llama3.1"
    timeout_s: float = 120.0
    max_retries: int = 4
    script_path: str = ""  # for the scripted provider; empty = the built-in demo script

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "LLMSettings":
        return cls(
            # Pointing AGENTMESH_LLM_BASE_URL at a server is enough to use it; without one the
            # scripted provider keeps the stack usable offline.
            provider=env_choice(
                env,
                "AGENTMESH_LLM_PROVIDER",
                "openai" if env_str(env, "AGENTMESH_LLM_BASE_URL") else "scripted",
                ("openai", "anthropic", "scripted"),
            ),
            base_url=env_str(env, "AGENTMESH_LLM_BASE_URL", cls.base_url).rstrip("/"),
            api_key=env_str(env, "AGENTMESH_LLM_API_KEY"),
            model=env_str(env, "AGENTMESH_LLM_MODEL", cls.model),
            timeout_s=env_float(env, "AGENTMESH_LLM_TIMEOUT_S", cls.timeout_s, minimum=1),
            max_retries=env_int(env, "AGENTMESH_LLM_MAX_RETRIES", cls.max_retries, minimum=0),
            script_path=env_str(env, "AGENTMESH_LLM_SCRIPT"),
        )


@dataclass(frozen=True)
class Settings:
    """What every service knows: where data lives, where its peers are, how to report."""

    home: Path
    addresses: Mapping[str, str]
    llm: LLMSettings
    sandbox: str = "local"
    qdrant_url: str = ""
    log_level: str = "info"
    # Addresses a service binds to; defaults to its entry in `addresses`.
    listen_address: str = ""
    # Shutdown grace: how long in-flight RPCs may run on SIGTERM before they are cancelled.
    drain_s: float = 20.0
    # Gateway bearer tokens; empty disables authentication (local default).
    auth_tokens: tuple[str, ...] = field(default=(), repr=False)
    # The token the CLI presents when authentication is on (services sign their own calls).
    client_token: str = field(default="", repr=False)
    # Each service's signing key and its peers' public keys (docs/security.md); empty: home/keys.
    service_keys_dir: str = ""
    # Tracing: "local" keeps spans under home; "otlp" exports; "none" disables.
    traces: str = "local"
    environ: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        env = dict(os.environ if env is None else env)
        home = Path(env_str(env, "AGENTMESH_HOME", str(Path.home() / ".agentmesh"))).expanduser()
        addresses = {
            name: env_str(env, f"AGENTMESH_{name.upper()}_ADDR", f"127.0.0.1:{port}")
            for name, port in DEFAULT_PORTS.items()
        }
        default_traces = "otlp" if env_str(env, "OTEL_EXPORTER_OTLP_ENDPOINT") else "local"
        tokens = tuple(t for t in env_str(env, "AGENTMESH_AUTH_TOKENS").split(",") if t.strip())
        return cls(
            home=home,
            addresses=addresses,
            llm=LLMSettings.from_env(env),
            sandbox=env_choice(env, "AGENTMESH_SANDBOX", "local", ("local", "kubernetes")),
            qdrant_url=env_str(env, "AGENTMESH_QDRANT_URL"),
            log_level=env_choice(env, "AGENTMESH_LOG_LEVEL", "info", ("debug", "info", "warning", "error")),
            listen_address=env_str(env, "AGENTMESH_LISTEN_ADDR"),
            drain_s=env_float(env, "AGENTMESH_DRAIN_S", 20.0, minimum=0),
            auth_tokens=tuple(t.strip() for t in tokens),
            client_token=env_str(env, "AGENTMESH_AUTH_TOKEN"),
            service_keys_dir=env_str(env, "AGENTMESH_SERVICE_KEYS_DIR"),
            traces=env_choice(env, "AGENTMESH_TRACES", default_traces, ("local", "otlp", "none")),
            environ=env,
        )

    @property
    def keys_dir(self) -> Path:
        return Path(self.service_keys_dir).expanduser() if self.service_keys_dir else self.home / "keys"

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
