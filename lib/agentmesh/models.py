"""The models a deployment offers, by name: AGENTMESH_MODELS (a JSON or YAML file) beside the
single AGENTMESH_LLM_* model, which is always there as `default` — unless the file has an entry
named `default`, which then is the default model.

    models:
      - name: small
        provider: openai                 # openai | anthropic
        base_url: http://localhost:11434/v1
        model: llama3.1:8b
        api_key_env: ""                  # the name of the variable holding the key, never the key
        context_window: 131072           # tokens; sets the agent's context budget for it
        prices: {input_per_mtok: 0.0, output_per_mtok: 0.0}
        temperature: 0.2                 # sampling parameters, sent with every request
        top_p: 0.9
        max_output_tokens: 2048
        text_tool_calls: false           # true: tools described in the prompt, calls parsed from
                                         # <tool_call>{"name": ..., "arguments": {...}}</tool_call>
        vision: false                    # false: the model takes no images, which it is shown as
                                         # one line of text each; default true
        max_concurrency: 64              # calls to it at once, the rest wait (visibly); 0: no
                                         # limit; unset: AGENTMESH_LLM_MAX_CONCURRENCY
        fallback: default                # used when this one fails after its retries

Plain data, parsed once at start-up; a bad file is a ConfigError naming the entry and the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from agentmesh.errors import ConfigError
from agentmesh.secret_fields import secret_field

__all__ = ["DEFAULT_MODEL", "MAX_CONCURRENCY", "MAX_MODELS", "PROVIDERS", "ModelCatalog", "ModelSpec", "catalog_of", "load_catalog", "load_model_file"]

DEFAULT_MODEL = "default"
PROVIDERS = ("openai", "anthropic", "scripted")
MAX_MODELS = 64


@dataclass(frozen=True)
class ModelSpec:
    name: str
    provider: str
    base_url: str
    model: str
    api_key_env: str = ""
    # From the variable api_key_env names; never printed, masked in logs and model replies.
    api_key: str = secret_field()
    context_window: int = 0
    input_price_per_mtok: float = 0.0
    output_price_per_mtok: float = 0.0
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int = 0
    fallback: str = ""
    # For models without native function calling: tools are described in the system prompt and
    # calls parsed from the reply's text (agent/providers/text_tools.py).
    text_tool_calls: bool = False
    # Calls to it at once (agent/providers/slots.py); 0: no limit; None: the deployment's
    # AGENTMESH_LLM_MAX_CONCURRENCY.
    max_concurrency: int | None = None
    # Whether the model takes images (docs/agent.md "Images"); one that does not is shown each as
    # a line of text ("[image: … — this model does not take images]"). Default true: the models
    # people configure today mostly do, and a text-only one says so with `vision: false`.
    vision: bool = True
    # A namespace's own model (a ModelConfig, docs/agents.md): its namespace, and the Secret and
    # key holding its API key, read by the agent from AGENTMESH_MODEL_SECRETS_DIR; "": the deployment's.
    namespace: str = ""
    api_key_secret: str = ""
    api_key_secret_key: str = ""


@dataclass(frozen=True)
class ModelCatalog:
    """Every named model; `default` is the AGENTMESH_LLM_* one."""

    models: Mapping[str, ModelSpec] = field(default_factory=dict)
    # The models that compact and reflect (AGENTMESH_COMPACTION_MODEL, AGENTMESH_REFLECTION_MODEL);
    # "": the model of the turn (compaction), of the session (reflection).
    compaction: str = ""
    reflection: str = ""

    @classmethod
    def of(cls, default: ModelSpec, named: Mapping[str, ModelSpec], *, compaction: str = "",
           reflection: str = "") -> "ModelCatalog":
        """`named` (AGENTMESH_MODELS, as loaded into the settings) with `default` under its name."""
        return cls({DEFAULT_MODEL: default, **named}, compaction, reflection)

    def roles(self, name: str) -> list[str]:
        """What `name` serves: chat (any model a turn names), and compaction and reflection where
        configured (else every model does them for its own turns and sessions)."""
        roles = ["chat"]
        for role, chosen in (("compaction", self.compaction), ("reflection", self.reflection)):
            if not chosen or chosen == name:
                roles.append(role if chosen else f"{role} (own)")
        return roles

    def names(self) -> list[str]:
        return [DEFAULT_MODEL, *sorted(n for n in self.models if n != DEFAULT_MODEL)]

    def get(self, name: str) -> ModelSpec | None:
        return self.models.get(name or DEFAULT_MODEL)

    def unknown_model_message(self, name: str, what: str = "options.model") -> str:
        return f"{what} {name[:80]!r} is not a model this deployment offers; known models: {', '.join(self.names())}"


def load_catalog(path: str, default: ModelSpec, environ: Mapping[str, str] | None = None) -> ModelCatalog:
    """The catalogue of `path` (empty: only the default) with `default` under its name."""
    return ModelCatalog.of(default, load_model_file(path, environ or {}) if path else {})


def load_model_file(path: str, environ: Mapping[str, str], variable: str = "AGENTMESH_MODELS") -> dict[str, ModelSpec]:
    """The named models of the file at `path`, keys read from the variables they name."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"{variable}: cannot read {path!r} ({exc.strerror or exc})") from None
    # PyYAML is imported only when a catalogue is read: the command line loads this module with
    # the settings, and a command that reads no catalogue should not pay for the parser.
    import yaml  # type: ignore[import-untyped]  # PyYAML ships no type hints

    try:
        data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"{variable}: {path!r} is not valid {'JSON' if path.endswith('.json') else 'YAML'}: {exc}") from None
    entries = data.get("models") if isinstance(data, dict) else data
    if not isinstance(entries, list):
        raise ConfigError(f"{variable}: {path!r} must hold a list of models (or {{models: [...]}})")
    if len(entries) > MAX_MODELS:
        raise ConfigError(f"{variable}: at most {MAX_MODELS} models, got {len(entries)}")
    models: dict[str, ModelSpec] = {}
    for index, entry in enumerate(entries):
        spec = _spec(entry, f"{variable}: model {index + 1}")
        if spec.name in models:
            raise ConfigError(f"{variable}: model {index + 1}: the name {spec.name!r} is taken")
        if spec.api_key_env:
            spec = replace(spec, api_key=environ.get(spec.api_key_env, ""))
        models[spec.name] = spec
    for spec in models.values():
        if spec.fallback == spec.name:
            raise ConfigError(f"{variable}: model {spec.name!r} cannot fall back to itself")
        if spec.fallback and spec.fallback not in models and spec.fallback != DEFAULT_MODEL:
            raise ConfigError(f"{variable}: model {spec.name!r} falls back to {spec.fallback!r}, which is not defined")
    return models


def _spec(entry: Any, where: str) -> ModelSpec:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: expected a mapping of name, provider, base_url, model, ...")
    known = {"name", "provider", "base_url", "model", "api_key_env", "context_window", "prices", "temperature",
             "top_p", "max_output_tokens", "fallback", "text_tool_calls", "max_concurrency", "vision"}
    unknown = sorted(set(entry) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    name = str(entry.get("name") or "")
    if not name or len(name) > 64 or not all(c.isalnum() or c in "._-" for c in name):
        raise ConfigError(f"{where}: name is required: 1-64 characters of letters, digits, '.', '_' or '-'")
    provider = str(entry.get("provider") or "openai")
    if provider not in PROVIDERS:
        raise ConfigError(f"{where} ({name}): provider must be one of {', '.join(PROVIDERS)}, got {provider!r}")
    if not entry.get("model") or not entry.get("base_url"):
        raise ConfigError(f"{where} ({name}): model and base_url are required")
    prices = entry.get("prices") or {}
    try:
        spec = ModelSpec(
            name=name, provider=provider, base_url=str(entry["base_url"]), model=str(entry["model"]),
            api_key_env=str(entry.get("api_key_env") or ""),
            context_window=int(entry.get("context_window") or 0),
            input_price_per_mtok=float(prices.get("input_per_mtok") or 0),
            output_price_per_mtok=float(prices.get("output_per_mtok") or 0),
            temperature=None if entry.get("temperature") is None else float(entry["temperature"]),
            top_p=None if entry.get("top_p") is None else float(entry["top_p"]),
            text_tool_calls=_flag(entry.get("text_tool_calls"), f"{where} ({name}): text_tool_calls"),
            max_output_tokens=int(entry.get("max_output_tokens") or 0),
            fallback=str(entry.get("fallback") or ""),
            max_concurrency=_concurrency(entry.get("max_concurrency"), f"{where} ({name}): max_concurrency"),
            vision=True if entry.get("vision") is None else _flag(entry.get("vision"), f"{where} ({name}): vision"),
        )
    except (TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(f"{where} ({name}): a number field holds something else ({exc})") from None
    if spec.temperature is not None and not 0 <= spec.temperature <= 2:
        raise ConfigError(f"{where} ({name}): temperature must be between 0 and 2")
    if spec.top_p is not None and not 0 < spec.top_p <= 1:
        raise ConfigError(f"{where} ({name}): top_p must be above 0 and at most 1")
    if min(spec.context_window, spec.max_output_tokens) < 0 or min(spec.input_price_per_mtok, spec.output_price_per_mtok) < 0:
        raise ConfigError(f"{where} ({name}): context_window, max_output_tokens and prices must not be negative")
    return spec


MAX_CONCURRENCY = 1_000_000


def _concurrency(value: Any, what: str) -> int | None:
    """A whole number of calls, 0 (no limit) up to MAX_CONCURRENCY; absent: None (the default).
    Strict: `true` or `2.5` or `"many"` is a mistake to point out, not a number to guess at."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_CONCURRENCY:
        raise ConfigError(f"{what} must be a whole number of calls at once from 0 (no limit) to "
                          f"{MAX_CONCURRENCY}, got {value!r}")
    return value


def _flag(value: Any, what: str) -> bool:
    if value is None or isinstance(value, bool):
        return bool(value)
    raise ConfigError(f"{what} must be true or false, got {value!r}")


def catalog_of(llm: Any) -> ModelCatalog:
    """The deployment's catalogue from its `LLMSettings`: the AGENTMESH_LLM_* model as `default`
    (named as requests name it) and the AGENTMESH_MODELS ones loaded with the settings."""
    # A catalogue entry named `default` is the default model, with every field an entry has;
    # else the AGENTMESH_LLM_* settings are.
    default = llm.models.get(DEFAULT_MODEL) or ModelSpec(
        name=DEFAULT_MODEL, provider=llm.provider, base_url=llm.endpoint, model=llm.model_name,
        input_price_per_mtok=llm.input_price_per_mtok, output_price_per_mtok=llm.output_price_per_mtok,
        context_window=llm.context_window, vision=llm.vision)
    return ModelCatalog.of(default, llm.models, compaction=llm.compaction_model, reflection=llm.reflection_model)
