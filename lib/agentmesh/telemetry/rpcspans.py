"""The spans of gRPC calls: a CLIENT span where a call leaves, a SERVER span where it arrives.

Made by agentmesh's own interceptors (`agentmesh.rpc.client`, `agentmesh.rpc.calls`) with the
names and attributes of the OpenTelemetry gRPC conventions — span name `/pkg.Service/Method`,
`rpc.system`, `rpc.service`, `rpc.method`, `rpc.grpc.status_code` — rather than by
opentelemetry-instrumentation-grpc, whose interceptors cost a call about 0.1 ms of CPU on each
side (a second interceptor layer and its task, a proxy around the servicer context, a generator
re-yielding every streamed message) on a turn of a dozen calls (docs/benchmarks.md).

The client span ends when the call does (a done callback on the call), so a call returned
unawaited can still be cancelled and the cancellation reaches the server.
"""

from __future__ import annotations

from typing import Any, Coroutine

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import extract, inject
from opentelemetry.propagators.textmap import Setter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

__all__ = [
    "LONG_LIVED_STREAMS",
    "SERVER_FAULTS",
    "end_client_span",
    "end_when_done",
    "rpc_attributes",
    "server_span_status",
    "split_method",
    "start_carried_client_span",
    "start_client_span",
    "start_server_span",
]

# Streams open for as long as a service runs (the agent's catalog and background watches, the
# streams its turn's calls are carried on): part of no turn, so neither side makes a span of
# the stream itself — it would be a trace of its own, hours long. Carried calls get their own.
LONG_LIVED_STREAMS = ("/agentmesh.internal.v1.Tools/WatchCatalog", "/agentmesh.internal.v1.Tools/WatchBackground",
                      "/agentmesh.internal.v1.Memory/AppendStream", "/agentmesh.internal.v1.Memory/CarriedCalls",
                      "/agentmesh.internal.v1.Tools/CarriedCalls")

# Codes that mean the server failed (the OpenTelemetry RPC conventions): only these make a
# SERVER span an error; NOT_FOUND or INVALID_ARGUMENT are the caller's, and the call worked.
SERVER_FAULTS = frozenset({
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DATA_LOSS,
})
_STATUS_CODE = "rpc.grpc.status_code"


def split_method(full_method: str) -> tuple[str, str]:
    """"/agentmesh.v1.Gateway/Chat" -> ("agentmesh.v1.Gateway", "Chat")."""
    service, _, method = full_method.lstrip("/").rpartition("/")
    return service or "unknown", method or full_method


def rpc_attributes(full_method: str) -> dict[str, Any]:
    service, method = split_method(full_method)
    return {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}


class _MetadataSetter(Setter[grpc.aio.Metadata]):
    """Puts `traceparent` (and `tracestate`, baggage) into outgoing grpc.aio Metadata."""

    def set(self, carrier: grpc.aio.Metadata, key: str, value: str) -> None:
        carrier[key] = value


_SETTER = _MetadataSetter()


def start_client_span(tracer: trace.Tracer, full_method: str, attributes: dict[str, Any],
                      metadata: grpc.aio.Metadata) -> Span:
    """A CLIENT span for a call about to start, a child of the current span; its context is
    put into `metadata`, so the server's span is its child."""
    span = tracer.start_span(full_method, kind=SpanKind.CLIENT, attributes=attributes)
    inject(metadata, context=trace.set_span_in_context(span), setter=_SETTER)
    return span


def start_carried_client_span(tracer: trace.Tracer, full_method: str,
                              attributes: dict[str, Any]) -> tuple[Span, dict[str, str]]:
    """As start_client_span, for a call carried on a stream (rpc/carried.py): the trace
    context goes into the returned dict, for the carried call's header."""
    span = tracer.start_span(full_method, kind=SpanKind.CLIENT, attributes=attributes)
    carrier: dict[str, str] = {}
    inject(carrier, context=trace.set_span_in_context(span))
    return span, carrier


def _settled(coroutine: Coroutine[Any, Any, Any], default: Any) -> Any:
    """The value of a grpc.aio status coroutine once the call is done (it does not wait then)."""
    try:
        coroutine.send(None)
    except StopIteration as finished:
        return finished.value
    except Exception:  # noqa: BLE001 - a status we cannot read is reported as `default`
        return default
    coroutine.close()
    return default


def end_client_span(span: Span, code: grpc.StatusCode, details: str = "") -> None:
    span.set_attribute(_STATUS_CODE, code.value[0])
    if code != grpc.StatusCode.OK:
        span.set_status(Status(StatusCode.ERROR, details or code.name))
    span.end()


def end_when_done(span: Span, call: Any) -> None:
    """End `span` with the call's final status once the call is done."""

    def done(finished: Any) -> None:
        code = _settled(finished.code(), grpc.StatusCode.UNKNOWN)
        details = _settled(finished.details(), "") if code != grpc.StatusCode.OK else ""
        end_client_span(span, code, details)

    try:
        call.add_done_callback(done)
    except (AttributeError, NotImplementedError):  # not a grpc.aio call object: nothing to wait for
        end_client_span(span, grpc.StatusCode.OK)


def start_server_span(tracer: trace.Tracer, full_method: str, attributes: dict[str, Any],
                      metadata: dict[str, Any]) -> tuple[Span, object]:
    """A SERVER span continuing the caller's trace (its `traceparent` in `metadata`), made the
    current span; returns it and the token to hand to `otel_context.detach` at the end."""
    parent = extract(metadata)
    span = tracer.start_span(full_method, context=parent, kind=SpanKind.SERVER, attributes=attributes)
    return span, otel_context.attach(trace.set_span_in_context(span, parent))


def server_span_status(span: Span, code: grpc.StatusCode, details: str) -> None:
    span.set_attribute(_STATUS_CODE, code.value[0])
    if code in SERVER_FAULTS:
        span.set_status(Status(StatusCode.ERROR, f"{code}:{details}"))
