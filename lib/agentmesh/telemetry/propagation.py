"""W3C trace context of the current span, in the three shapes the services hand it on in:
a carrier dict, gRPC metadata, and the environment of a sandboxed process or pod."""

from __future__ import annotations

from opentelemetry.propagate import inject

__all__ = ["trace_context", "trace_metadata", "traceparent_env"]


def trace_context() -> dict[str, str]:
    """`traceparent` (and `tracestate`) of the current span; empty when nothing is traced."""
    carrier: dict[str, str] = {}
    inject(carrier)
    return carrier


def trace_metadata() -> tuple[tuple[str, str], ...]:
    """The trace context as gRPC metadata, for a call made without the tracing interceptor."""
    return tuple(trace_context().items())


def traceparent_env() -> dict[str, str]:
    """`TRACEPARENT` (and `TRACESTATE`) for a sandboxed process or pod, so its work joins the trace.

    Empty when no span is recording, so callers can always `env.update(traceparent_env())`.
    """
    carrier = trace_context()
    env = {}
    if carrier.get("traceparent"):
        env["TRACEPARENT"] = carrier["traceparent"]
        if carrier.get("tracestate"):
            env["TRACESTATE"] = carrier["tracestate"]
    return env
