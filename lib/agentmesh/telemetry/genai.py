"""Spans of an agent's work, named and attributed as the OpenTelemetry GenAI semantic
conventions say: one place for the attribute names, one factory per kind of span.

    with invoke_agent_span(tracer, agent_name="agentmesh", conversation_id=sid, model=m, provider=p) as span:
        with chat_span(tracer, model=m, provider=p) as call:
            ...
            set_usage(call, input_tokens=120, output_tokens=40)
        with execute_tool_span(tracer, name="shell", call_id="c1"):
            ...

The factories leave exceptions to the caller (`record_exception=False`,
`set_status_on_exception=False`): the loop decides what an error means — a cancelled turn, a
tool that failed in a way the model should read — and sets the status and `error.type` itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind
from opentelemetry.util.types import AttributeValue

__all__ = [
    "ERROR_TYPE",
    "GEN_AI_AGENT_NAME",
    "GEN_AI_CONVERSATION_ID",
    "GEN_AI_OPERATION_NAME",
    "GEN_AI_PROVIDER_NAME",
    "GEN_AI_REQUEST_MAX_TOKENS",
    "GEN_AI_REQUEST_MODEL",
    "GEN_AI_RESPONSE_FINISH_REASONS",
    "GEN_AI_RESPONSE_MODEL",
    "GEN_AI_SYSTEM",
    "GEN_AI_TOKEN_TYPE",
    "GEN_AI_TOOL_CALL_ID",
    "GEN_AI_TOOL_NAME",
    "GEN_AI_TOOL_TYPE",
    "GEN_AI_USAGE_INPUT_TOKENS",
    "GEN_AI_USAGE_OUTPUT_TOKENS",
    "chat_span",
    "execute_tool_span",
    "invoke_agent_span",
    "set_usage",
]

GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_AGENT_NAME = "gen_ai.agent.name"
GEN_AI_CONVERSATION_ID = "gen_ai.conversation.id"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_SYSTEM = "gen_ai.system"  # the older name of gen_ai.provider.name, still read by many backends
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID = "gen_ai.tool.call.id"
GEN_AI_TOOL_TYPE = "gen_ai.tool.type"
GEN_AI_TOKEN_TYPE = "gen_ai.token.type"  # on token-usage metric points: "input" | "output"
ERROR_TYPE = "error.type"

_Attributes = Mapping[str, AttributeValue]


def invoke_agent_span(
    tracer: trace.Tracer,
    *,
    agent_name: str,
    conversation_id: str,
    model: str,
    provider: str,
    attributes: _Attributes | None = None,
) -> AbstractContextManager[Span]:
    """The span of one turn (`invoke_agent`); `attributes` adds the caller's own."""
    return _span(tracer, "invoke_agent", SpanKind.INTERNAL, {
        GEN_AI_OPERATION_NAME: "invoke_agent",
        GEN_AI_AGENT_NAME: agent_name,
        GEN_AI_CONVERSATION_ID: conversation_id,
        GEN_AI_REQUEST_MODEL: model,
        GEN_AI_PROVIDER_NAME: provider,
        **(attributes or {}),
    })


def chat_span(
    tracer: trace.Tracer,
    *,
    model: str,
    provider: str,
    max_tokens: int = 0,
    attributes: _Attributes | None = None,
) -> AbstractContextManager[Span]:
    """The span of one model call (`chat {model}`, a client span)."""
    values: dict[str, AttributeValue] = {
        GEN_AI_OPERATION_NAME: "chat",
        GEN_AI_REQUEST_MODEL: model,
        GEN_AI_PROVIDER_NAME: provider,
        GEN_AI_SYSTEM: provider,
        **(attributes or {}),
    }
    if max_tokens:
        values[GEN_AI_REQUEST_MAX_TOKENS] = max_tokens
    return _span(tracer, f"chat {model}", SpanKind.CLIENT, values)


def execute_tool_span(
    tracer: trace.Tracer, *, name: str, call_id: str, attributes: _Attributes | None = None
) -> AbstractContextManager[Span]:
    """The span of one tool call (`execute_tool {name}`)."""
    return _span(tracer, f"execute_tool {name}", SpanKind.INTERNAL, {
        GEN_AI_OPERATION_NAME: "execute_tool",
        GEN_AI_TOOL_NAME: name,
        GEN_AI_TOOL_CALL_ID: call_id,
        GEN_AI_TOOL_TYPE: "function",
        **(attributes or {}),
    })


def set_usage(span: Span, *, input_tokens: int, output_tokens: int) -> None:
    span.set_attributes({GEN_AI_USAGE_INPUT_TOKENS: input_tokens, GEN_AI_USAGE_OUTPUT_TOKENS: output_tokens})


def _span(tracer: trace.Tracer, name: str, kind: SpanKind, attributes: dict[str, Any]) -> AbstractContextManager[Span]:
    return tracer.start_as_current_span(
        name, kind=kind, attributes=attributes, record_exception=False, set_status_on_exception=False
    )


