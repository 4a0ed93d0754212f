"""Which model a turn talks to: a model of the deployment's catalogue by name (AGENTMESH_MODELS,
`agentmesh.models`), or the configured one; and, when it fails after its retries, its fallback.

Plain Python over the providers the service built at start-up; the loop asks `current` before
each call and `fall_back()` when a call failed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from agentmesh.agent.providers.base import ModelProvider
from agentmesh.models import DEFAULT_MODEL


@dataclass(frozen=True)
class NamedModel:
    name: str  # the catalogue's name ("default": the AGENTMESH_LLM_* model)
    provider: ModelProvider
    model: str  # the id the API knows it by
    fallback: str = ""
    max_output_tokens: int = 0  # 0: the agent's configured AGENTMESH_LLM_MAX_TOKENS
    # Sampling parameters sent with every request to it; None: the server's default.
    temperature: float | None = None
    top_p: float | None = None
    # Its context window in tokens (loop/window.py); 0: unknown, AGENTMESH_AGENT_CONTEXT_WINDOW.
    context_window: int = 0
    # Whether it takes images (agentmesh.models); False: each is a line of text (loop/images.py).
    vision: bool = True


class ModelChoice:
    """One turn's model. `requested`: a catalogue name; any other text is a model id for the
    default provider (how `--model` worked before there was a catalogue)."""

    def __init__(self, models: dict[str, NamedModel], requested: str):
        self._models = models
        default = models[DEFAULT_MODEL]
        if requested and requested not in models:
            default = dataclasses.replace(default, model=requested)
        self.current = models.get(requested) or default
        self.chosen = self.current  # before any fallback
        self._tried = {self.current.name}

    def fall_back(self) -> NamedModel | None:
        """Switch to the current model's fallback; None when it has none (or it was tried)."""
        name = self.current.fallback
        if not name or name in self._tried or name not in self._models:
            return None
        self._tried.add(name)
        self.current = self._models[name]
        return self.current

    @property
    def fell_back(self) -> bool:
        return self.current is not self.chosen
