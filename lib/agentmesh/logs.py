"""structlog set-up: one JSON object per line, each carrying trace, span and session ids.

Secrets never reach a log line. Three nets catch them, in this order:
- fields whose name says credential (`api_key`, `authorization`, `password`, `*_token`, ...)
  are replaced whole, at any depth of nested dicts;
- every configured secret (the model key, gateway tokens) is masked wherever it appears in
  any string, including rendered exceptions and reprs of objects;
- shapes that are credentials whatever their value are masked: `Bearer ...`/`Basic ...`,
  `sk-...` keys, `?api_key=`/`?token=`-style query parameters, `user:password@` in URLs.
Records from libraries that log through stdlib `logging` (httpx, grpc, qdrant) go through
the same processors, so they are JSON lines with the same ids and the same redaction.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import Any, Iterable

import structlog
from opentelemetry import trace
from structlog.typing import EventDict, Processor

from agentmesh.config import secret_values

__all__ = ["REDACTED", "Redactor", "configure_logging", "get_logger", "mask_also", "secrets_of"]

REDACTED = "[redacted]"

# Field names that hold a credential. Anchored on whole words so that `input_tokens` or
# `max_tokens` (counts, not secrets) stay readable.
_SECRET_KEY = re.compile(
    r"^(?:.*[_\-.])?(?:api[_\-]?key|apikey|authorization|proxy[_\-]authorization|auth|password|passwd|"
    r"secret|token|bearer|credentials?|cookie|set[_\-]cookie|private[_\-]?key)$",
    re.I,
)
_SECRET_SHAPES = (
    (re.compile(r"\b(bearer|basic)(\s+)[A-Za-z0-9\-._~+/]+=*", re.I), r"\1\2" + REDACTED),
    (re.compile(r"\bsk-[A-Za-z0-9_\-]{8,}"), REDACTED),
    (
        re.compile(
            r"([?&;](?:api[_\-]?key|key|token|access_token|id_token|refresh_token|auth|password|secret|"
            r"sig|signature|x-amz-signature|x-goog-signature)=)[^&#\s\"'<>]+",
            re.I,
        ),
        r"\1" + REDACTED,
    ),
    (
        re.compile(r"(\b(?:x-api-key|api[_\-]?key|authorization|(?:access[_\-]|refresh[_\-]|auth[_\-])?token|"
                   r"(?:client[_\-])?secret|password|passwd)[\"']?\s*[:=]\s*[\"']?)(?!\[redacted\]|(?:bearer|basic)\s)([^\s\"',}\]]+)", re.I),
        r"\1" + REDACTED,
    ),
    (re.compile(r"(://[^/\s:@]+:)[^/\s@]+@"), r"\1" + REDACTED + "@"),
)

# One pass that finds whether any of the shapes above may be in a text: most values of a line
# (ids, names, numbers as text) hold none, and running the five substitutions on each of them
# made rendering a line cost ~0.2 ms. A superset (case-insensitive throughout), so nothing the
# substitutions would mask is skipped.
_ANY_SHAPE = re.compile("|".join(f"(?:{pattern.pattern})" for pattern, _ in _SECRET_SHAPES), re.I)

_HANDLER_TAG = "_agentmesh_json_handler"


def _is_secret_field(name: Any) -> bool:
    return bool(_SECRET_KEY.match(str(name)))


def _add_trace_context(_logger: Any, _method: str, event: EventDict) -> EventDict:
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        event.setdefault("trace_id", format(ctx.trace_id, "032x"))
        event.setdefault("span_id", format(ctx.span_id, "016x"))
    else:
        event.setdefault("trace_id", "")
        event.setdefault("span_id", "")
    event.setdefault("session_id", "")
    return event


class Redactor:
    """A structlog processor; also usable alone: `Redactor(["sk-..."]).mask(value)`."""

    _KEEP = frozenset({"event", "timestamp", "level", "trace_id", "span_id", "session_id", "logger", "service"})

    def __init__(self, secrets: Iterable[str] = ()):
        # Longest first, so a secret containing another is masked whole.
        self._secrets = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)

    def add(self, secret: str) -> None:
        """Mask `secret` too from now on (a credential read after start-up)."""
        if secret and len(secret) >= 4 and secret not in self._secrets:
            self._secrets = sorted([*self._secrets, secret], key=len, reverse=True)

    def mask_text(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        if _ANY_SHAPE.search(text) is None:
            return text
        for pattern, replacement in _SECRET_SHAPES:
            text = pattern.sub(replacement, text)
        return text

    def mask(self, value: Any, depth: int = 0) -> Any:
        if isinstance(value, str):
            return self.mask_text(value)
        if value is None or isinstance(value, (bool, int, float)):
            return value
        if depth > 20:
            return REDACTED
        if isinstance(value, dict):
            return {
                self.mask_text(str(k)): (REDACTED if _is_secret_field(k) else self.mask(v, depth + 1))
                for k, v in value.items()
            }
        if isinstance(value, (list, tuple, set, frozenset)):
            return [self.mask(v, depth + 1) for v in value]
        if isinstance(value, (bytes, bytearray)):
            return self.mask_text(bytes(value).decode("utf-8", "replace"))
        # Anything else would be rendered with repr() after us; render it here so it is masked.
        try:
            return self.mask_text(repr(value))
        except Exception:  # noqa: BLE001 - a broken __repr__ must not break logging
            return f"<unrepresentable {type(value).__name__}>"

    def __call__(self, _logger: Any, _method: str, event: EventDict) -> EventDict:
        return {
            k: (REDACTED if k not in self._KEEP and _is_secret_field(k) else self.mask(v))
            for k, v in event.items()
        }


def secrets_of(settings: Any) -> list[str]:
    """The credentials a settings tree carries (every field declared `secret=True`), for
    `configure_logging(..., secrets=...)`. Header lists (`k=v,k2=v2`) count by their values too."""
    found: list[str] = []
    for value in secret_values(settings):
        found.append(value)
        found += [item.partition("=")[2].strip() for item in value.split(",") if "=" in item]
    return [s for s in found if s]


def configure_logging(service: str, level: str = "info", secrets: Iterable[str] = (), stream: Any = None) -> None:
    """Route structlog and stdlib logging to JSON lines on `stream` (stderr by default).

    Calling it again replaces the previous configuration (tests call it with their own stream).
    """
    stream = stream or sys.stderr
    redactor = Redactor(secrets)
    _ACTIVE[:] = [redactor]
    service_name = f"agentmesh-{service}"

    def add_service(_logger: Any, _method: str, event: EventDict) -> EventDict:
        # A processor rather than a bound context variable, so that records from threads
        # (exporters, grpc, the model server in tests) carry it too.
        event.setdefault("service", service_name)
        return event

    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        add_service,
        _name_logger,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _add_trace_context,
    ]
    rendering: list[Processor] = [structlog.processors.format_exc_info, redactor, structlog.processors.JSONRenderer()]
    numeric = getattr(logging, level.upper(), logging.INFO)
    structlog.configure(
        processors=[*shared, *rendering],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )

    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *rendering],
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    setattr(handler, _HANDLER_TAG, True)
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_TAG, False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    # Libraries stay at WARNING unless debugging was asked for; at any level their lines are
    # redacted like ours.
    root.setLevel(logging.DEBUG if numeric <= logging.DEBUG else logging.WARNING)


_ACTIVE: list[Redactor] = []  # the redactor of the logging configure_logging set up last


def mask_also(secret: str) -> None:
    """Mask `secret` in every log line from now on (a key the process read after start-up)."""
    for redactor in _ACTIVE:
        redactor.add(secret)


def get_logger(name: str = "agentmesh") -> Any:
    # `logger` is a reserved keyword of structlog.get_logger; `_name_logger` renames the key.
    return structlog.get_logger(name, logger_name=name)


def _name_logger(_logger: Any, _method: str, event: EventDict) -> EventDict:
    if "logger_name" in event:
        event.setdefault("logger", event.pop("logger_name"))
    return event
