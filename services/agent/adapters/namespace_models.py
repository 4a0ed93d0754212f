"""A namespace's own models (ModelConfig resources, docs/agents.md#modelconfig): the provider of
each built the first time a turn names it, and kept while its entry and key stay the same.

Its API key is a Kubernetes Secret's key, which the operator mounts for the agent under
AGENTMESH_MODEL_SECRETS_DIR as `<namespace>/<secret>/<key>` (one Secret volume per namespace's
Secret; the pattern of MCP server secrets). It is read each time a turn asks for the model, so a
rotated Secret is used from the next turn on; a key read is masked from then on in the recorded
model calls (`also_mask`), the logs and the model's replies.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterable

from agentmesh.agent.loop.model_choice import NamedModel
from agentmesh.agent.providers import build_provider
from agentmesh.agent.providers.text_tools import TextToolCalls
from agentmesh.agent.settings import AgentSettings
from agentmesh.errors import FailedPrecondition
from agentmesh.logs import get_logger, mask_also
from agentmesh.models import ModelSpec
from agentmesh.telemetry import Telemetry

__all__ = ["MountedKeyModels", "read_mounted_key"]

log = get_logger("agentmesh.agent.namespace_models")

MAX_KEY_BYTES = 64 * 1024
MAX_CACHED = 256


def read_mounted_key(directory: str, spec: ModelSpec) -> str:
    """The key of `spec`'s Secret reference ("" for a model without one); FailedPrecondition, in
    a sentence naming what is missing, when it is not mounted."""
    if not spec.api_key_secret:
        return ""
    what = f"model {spec.name!r} of namespace {spec.namespace!r}"
    if not directory:
        raise FailedPrecondition(f"{what} takes its key from Secret {spec.api_key_secret!r}, but no Secrets are "
                                 "mounted for the agent (AGENTMESH_MODEL_SECRETS_DIR is not set)")
    if spec.namespace in ("", ".", ".."):
        raise FailedPrecondition(f"{what}: a namespace's secrets live in a directory of its name")
    path = Path(directory) / spec.namespace / spec.api_key_secret / spec.api_key_secret_key
    root = os.path.realpath(directory)
    if not path.is_file() or not os.path.realpath(path).startswith(root + os.sep):
        raise FailedPrecondition(f"{what} takes its key from key {spec.api_key_secret_key!r} of Secret "
                                 f"{spec.api_key_secret!r}, which is not mounted for the agent (no file {path})")
    data = path.read_bytes()[:MAX_KEY_BYTES + 1]
    if len(data) > MAX_KEY_BYTES:
        raise FailedPrecondition(f"{what}: its key file is over {MAX_KEY_BYTES} bytes")
    return data.decode("utf-8", errors="replace").strip()


class MountedKeyModels:
    """`NamespaceModels` (loop/ports.py). `llm`: the deployment's LLMSettings, the base of each
    model's (retries, timeouts, concurrency); `keys`: the deployment's keys, masked in every reply."""

    def __init__(self, llm: Any, settings: AgentSettings, telemetry: Telemetry | None, secrets_dir: str,
                 keys: Iterable[str] = (), also_mask: Callable[[str], None] | None = None):
        self._llm = llm
        self._settings = settings
        self._telemetry = telemetry
        self._dir = secrets_dir
        self._keys = tuple(k for k in keys if k)
        self._also_mask = also_mask
        self._built: dict[tuple[ModelSpec, str], NamedModel] = {}
        self._closers: list[Callable[[], Awaitable[None]]] = []

    def named(self, spec: ModelSpec) -> NamedModel:
        key = read_mounted_key(self._dir, spec)
        # The entry (every field) and the key: an edited ModelConfig or a rotated Secret is another model.
        cached = self._built.get((spec, key))
        if cached is not None:
            return cached
        if key:
            mask_also(key)
            if self._also_mask is not None:
                self._also_mask(key)
        llm = dataclasses.replace(self._llm, provider=spec.provider, base_url=spec.base_url.rstrip("/"),
                                  model=spec.model, api_key=key)
        provider, close = build_provider(llm, self._settings, self._telemetry, name=spec.name,
                                         keys=(*self._keys, key))
        if spec.text_tool_calls:
            provider = TextToolCalls(provider)
        model = NamedModel(spec.name, provider, spec.model, spec.fallback, spec.max_output_tokens,
                           temperature=spec.temperature, top_p=spec.top_p, context_window=spec.context_window,
                           vision=spec.vision)
        if len(self._built) >= MAX_CACHED:  # entries edited many times: start over (their clients close at exit)
            self._built.clear()
        self._built[(spec, key)] = model
        self._closers.append(close)
        log.info("namespace model ready", namespace=spec.namespace, model=spec.name, provider=spec.provider)
        return model

    async def aclose(self) -> None:
        closers, self._closers = self._closers, []
        for close in closers:
            await close()
