"""W3C trace context for sandboxed programs, so work inside a jail or pod joins the call's trace."""

from __future__ import annotations

from opentelemetry import propagate


def current_traceparent() -> str:
    """The `traceparent` of the current span (empty when nothing is being traced)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent", "")
