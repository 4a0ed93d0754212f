"""One model call as the loop and compaction make it: streamed through the provider under a
GenAI `chat {model}` span, with retries reported, usage added up and the call's metrics
recorded — so every model call of a turn looks the same in traces and dashboards."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

from opentelemetry.trace import Status, StatusCode

from agentmesh.agent.loop.usage_log import UsageTag
from agentmesh.agent.providers.base import ModelProvider
from agentmesh.agent.types import (
    ModelReply,
    ModelRequest,
    ReasoningChunk,
    ReasoningDeltaEvent,
    Retrying,
    StatusEvent,
    TextChunk,
    TextDeltaEvent,
    Usage,
    WaitingForSlot,
)
from agentmesh.errors import AgentmeshError, Unavailable
from agentmesh.logs import get_logger
from agentmesh.telemetry import Telemetry
from agentmesh.telemetry.genai import (
    ERROR_TYPE,
    GEN_AI_RESPONSE_FINISH_REASONS,
    GEN_AI_RESPONSE_MODEL,
    chat_span,
    set_usage,
)

log = get_logger("agentmesh.agent")


async def traced_model_call(
    provider: ModelProvider,
    telemetry: Telemetry,
    request: ModelRequest,
    *,
    usage: Usage,
    emit: Callable[[Any], None],
    stream_text: bool = True,
    what: str = "model call",
    extra_attributes: dict[str, Any] | None = None,
    tag: UsageTag | None = None,
) -> ModelReply:
    """The reply to `request`. Text streams out as `TextDeltaEvent`s (reasoning as
    `ReasoningDeltaEvent`s) unless `stream_text` is off; each retry becomes a span event and a `StatusEvent` naming `what` failed,
    and a wait for one of the model's slots a span event and a `StatusEvent` saying so.
    The reply's usage is added to `usage` and, with a `tag`, recorded in the usage ledger."""
    name = provider.name
    metrics = telemetry.metrics
    started = time.monotonic()
    with chat_span(telemetry.tracer, model=request.model, provider=name, max_tokens=request.max_tokens,
                   attributes=extra_attributes) as span:
        reply: ModelReply | None = None
        try:
            async for item in provider.stream(request):
                if isinstance(item, TextChunk):
                    if stream_text:
                        emit(TextDeltaEvent(item.text))
                elif isinstance(item, ReasoningChunk):
                    if stream_text:  # reasoning has its own event kind, never text_delta
                        emit(ReasoningDeltaEvent(item.text))
                elif isinstance(item, Retrying):
                    span.add_event("retry", {"attempt": item.attempt, "reason": item.reason, "delay_s": item.delay_s})
                    log.info(f"{what} retrying", attempt=item.attempt, reason=item.reason, delay_s=round(item.delay_s, 3))
                    emit(StatusEvent(
                        f"{what} failed ({item.reason}); retrying in {item.delay_s:.1f}s "
                        f"(attempt {item.attempt + 1} of {item.max_attempts})"
                    ))
                elif isinstance(item, WaitingForSlot):
                    # The turn is not stuck: it queues, in the open, behind its model's limit.
                    span.add_event("wait_for_slot", {"limit": item.limit, "waiting": item.waiting})
                    emit(StatusEvent(
                        f"waiting for a model slot: {item.model!r} is answering {item.limit} calls at once, "
                        f"its limit (max_concurrency); {item.waiting} waiting"
                    ))
                elif isinstance(item, ModelReply):
                    reply = item
            if reply is None:
                raise Unavailable(f"the {name} model provider ended without an answer")
        except BaseException as exc:
            error_type = exc.code if isinstance(exc, AgentmeshError) else (
                "cancelled" if isinstance(exc, asyncio.CancelledError) else type(exc).__name__)
            span.set_status(Status(StatusCode.ERROR, getattr(exc, "message", error_type)))
            span.set_attribute(ERROR_TYPE, error_type)
            metrics.record_model_call(model=request.model, provider=name, seconds=time.monotonic() - started,
                                      error_type=error_type)
            raise
        usage.add(reply.usage)
        if tag is not None:
            tag.record(reply.usage)
            if tag.calls is not None:
                tag.calls.record(tag, request, reply)
        set_usage(span, input_tokens=reply.usage.input_tokens, output_tokens=reply.usage.output_tokens)
        span.set_attribute(GEN_AI_RESPONSE_FINISH_REASONS, [reply.finish_reason] if reply.finish_reason else [])
        if reply.model:
            span.set_attribute(GEN_AI_RESPONSE_MODEL, reply.model)
        metrics.record_model_call(
            model=request.model, provider=name, seconds=time.monotonic() - started,
            input_tokens=reply.usage.input_tokens, output_tokens=reply.usage.output_tokens,
            response_model=reply.model,
        )
    return reply
