"""structlog set-up: one JSON object per line, each carrying trace, span and session ids.

Secrets never reach a log line: keys that look like credentials are redacted, and values
that contain a configured secret are masked wherever they appear.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import Any, Iterable

import structlog
from opentelemetry import trace

_SECRET_KEYS = re.compile(r"(api[_-]?key|authorization|password|secret|token|credential)", re.I)
REDACTED = "[redacted]"


def _add_trace_context(_logger: Any, _method: str, event: dict[str, Any]) -> dict[str, Any]:
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        event.setdefault("trace_id", format(ctx.trace_id, "032x"))
        event.setdefault("span_id", format(ctx.span_id, "016x"))
    else:
        event.setdefault("trace_id", "")
        event.setdefault("span_id", "")
    event.setdefault("session_id", "")
    return event


class _Redactor:
    def __init__(self, secrets: Iterable[str]):
        self._secrets = [s for s in secrets if s and len(s) >= 4]

    def _mask(self, value: Any) -> Any:
        if isinstance(value, str):
            for secret in self._secrets:
                if secret in value:
                    value = value.replace(secret, REDACTED)
            return value
        if isinstance(value, dict):
            return {k: (REDACTED if _SECRET_KEYS.search(str(k)) else self._mask(v)) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self._mask(v) for v in value)
        return value

    def __call__(self, _logger: Any, _method: str, event: dict[str, Any]) -> dict[str, Any]:
        return {
            k: (REDACTED if _SECRET_KEYS.search(k) and k not in ("event",) else self._mask(v))
            for k, v in event.items()
        }


def configure_logging(service: str, level: str = "info", secrets: Iterable[str] = (), stream: Any = None) -> None:
    """Route structlog and stdlib logging to JSON lines on `stream` (stderr by default)."""
    processors = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _add_trace_context,
        structlog.processors.format_exc_info,
        _Redactor(secrets),
        structlog.processors.JSONRenderer(),
    ]
    numeric = getattr(logging, level.upper(), logging.INFO)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=stream or sys.stderr),
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.bind_contextvars(service=f"agentmesh-{service}")
    # Libraries that log through stdlib (httpx, grpc) stay quiet below WARNING so that
    # request URLs with credentials in query strings never show up at INFO.
    logging.basicConfig(level=logging.WARNING, stream=stream or sys.stderr)


def get_logger(name: str = "agentmesh") -> Any:
    return structlog.get_logger(name)
