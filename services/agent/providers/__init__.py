"""Model providers: `openai` (any OpenAI-compatible server), `anthropic`, `scripted`.

`build_provider` picks one from the LLM settings and returns it with the clean-up to run
when the service stops (closing the shared httpx client). An HTTP provider comes wrapped: its
calls hold one of the model's slots (slots.py: its concurrency limit, waits made visible) and
the configured model keys are masked in what it says (redaction.py).
"""

from __future__ import annotations

from typing import Awaitable, Callable, Iterable

import httpx

from agentmesh.agent.providers.anthropic import AnthropicProvider
from agentmesh.agent.providers.base import ModelProvider, RetryPolicy, build_timeout
from agentmesh.agent.providers.http_span import TracedClient
from agentmesh.agent.providers.openai import OpenAIProvider
from agentmesh.agent.providers.redaction import KeyRedacting, keys_worth_masking
from agentmesh.agent.providers.scripted import ScriptedProvider, load_script
from agentmesh.agent.providers.slots import ModelSlots, SlotLimited, pool_limits
from agentmesh.agent.settings import AgentSettings
from agentmesh.config import LLMSettings
from agentmesh.models import DEFAULT_MODEL
from agentmesh.telemetry import Telemetry
from agentmesh.tls import httpx_context

ANTHROPIC_BASE_URL = "https://api.anthropic.com/v1"

__all__ = ["AnthropicProvider", "ModelProvider", "OpenAIProvider", "RetryPolicy", "ScriptedProvider", "build_provider",
           "model_keys"]


def http_client(timeout_s: float, connect_timeout_s: float, telemetry: Telemetry | None,
                max_concurrency: int = 0) -> httpx.AsyncClient:
    """One pooled client per provider; traced with the service's own tracer (never the global
    one): a `POST` span per request, which carries `traceparent` (http_span.py). Its pool holds
    as many connections as the model has slots (0: unbounded), so it never queues a call."""
    timeout = build_timeout(timeout_s, connect_timeout_s)
    limits = pool_limits(max_concurrency)
    # Environment proxies apply (corporate set-ups); the key travels only in headers.
    if telemetry is None:
        return httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=True, verify=httpx_context())
    return TracedClient(tracer=telemetry.tracer, timeout=timeout, limits=limits, trust_env=True, verify=httpx_context())


def model_keys(llm: LLMSettings) -> tuple[str, ...]:
    """Every configured model key: the AGENTMESH_LLM_* model's and each catalogue model's."""
    return (llm.api_key, *(getattr(spec, "api_key", "") for spec in llm.models.values()))


def build_provider(
    llm: LLMSettings, agent: AgentSettings, telemetry: Telemetry | None = None, *,
    name: str = DEFAULT_MODEL, keys: Iterable[str] | None = None,
) -> tuple[ModelProvider, Callable[[], Awaitable[None]]]:
    """The provider `llm` names, with its HTTP client's closer. Without a base URL each API's
    default applies: a local OpenAI-compatible server, or Anthropic's own API. `name` is the
    model's catalogue name (its slots' metrics say it); `keys` the keys masked in its replies
    (default: every key `llm` holds)."""
    if llm.provider == "scripted":

        async def nothing() -> None:
            return None

        return ScriptedProvider(load_script(llm.script_path)), nothing
    retry = RetryPolicy(
        max_retries=llm.max_retries,
        base_s=agent.retry_base_s,
        max_s=agent.retry_max_s,
        retry_after_max_s=agent.retry_after_max_s,
    )
    client = http_client(llm.timeout_s, agent.connect_timeout_s, telemetry, llm.max_concurrency)
    provider: ModelProvider
    if llm.provider == "anthropic":
        # The shared default base URL is a local OpenAI-compatible server; Anthropic's own API
        # is the sensible default when the provider is anthropic and no URL was given.
        base_url = llm.base_url or ANTHROPIC_BASE_URL
        provider = AnthropicProvider(client, base_url, llm.api_key, retry)
    else:
        provider = OpenAIProvider(client, llm.endpoint, llm.api_key, retry)
    if llm.max_concurrency > 0:  # without a limit there is no wait to hold, say or count
        slots = ModelSlots(name, llm.max_concurrency, telemetry.metrics if telemetry is not None else None)
        provider = SlotLimited(provider, slots)
    masked = keys_worth_masking(model_keys(llm) if keys is None else keys)
    if masked:
        provider = KeyRedacting(provider, masked)
    return provider, client.aclose
