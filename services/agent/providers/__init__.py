"""Model providers: `openai` (any OpenAI-compatible server), `anthropic`, `scripted`.

`build_provider` picks one from the LLM settings and returns it with the clean-up to run
when the service stops (closing the shared httpx client).
"""

from __future__ import annotations

from typing import Awaitable, Callable

import httpx

from agentmesh.agent.providers.anthropic import AnthropicProvider
from agentmesh.agent.providers.base import ModelProvider, RetryPolicy, build_timeout
from agentmesh.agent.providers.http_span import TracedClient
from agentmesh.agent.providers.openai import OpenAIProvider
from agentmesh.agent.providers.scripted import ScriptedProvider, load_script
from agentmesh.agent.settings import AgentSettings
from agentmesh.config import LLMSettings
from agentmesh.telemetry import Telemetry

ANTHROPIC_BASE_URL = "https://api.anthropic.com/v1"

__all__ = ["AnthropicProvider", "ModelProvider", "OpenAIProvider", "RetryPolicy", "ScriptedProvider", "build_provider"]


def http_client(timeout_s: float, connect_timeout_s: float, telemetry: Telemetry | None) -> httpx.AsyncClient:
    """One pooled client per provider; traced with the service's own tracer (never the global
    one): a `POST` span per request, which carries `traceparent` (http_span.py)."""
    timeout = build_timeout(timeout_s, connect_timeout_s)
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=20)
    # Environment proxies apply (corporate set-ups); the key travels only in headers.
    if telemetry is None:
        return httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=True)
    return TracedClient(tracer=telemetry.tracer, timeout=timeout, limits=limits, trust_env=True)


def build_provider(
    llm: LLMSettings, agent: AgentSettings, telemetry: Telemetry | None = None
) -> tuple[ModelProvider, Callable[[], Awaitable[None]]]:
    """The provider `llm` names, with its HTTP client's closer. Without a base URL each API's
    default applies: a local OpenAI-compatible server, or Anthropic's own API."""
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
    client = http_client(llm.timeout_s, agent.connect_timeout_s, telemetry)
    if llm.provider == "anthropic":
        # The shared default base URL is a local OpenAI-compatible server; Anthropic's own API
        # is the sensible default when the provider is anthropic and no URL was given.
        base_url = llm.base_url or ANTHROPIC_BASE_URL
        return AnthropicProvider(client, base_url, llm.api_key, retry), client.aclose
    return OpenAIProvider(client, llm.endpoint, llm.api_key, retry), client.aclose
