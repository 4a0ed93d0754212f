"""The audit log: who did what, one JSON object per line, and the same on the call's span.

Security-relevant decisions only — a session created or deleted, an approval decided, a cron
job changed, a sign-in refused, an attempt to reach another tenant's data — each with the
principal, its tenants, the outcome and the trace id, so a line leads to the trace and back.
With AGENTMESH_AUDIT_LOG set, lines go to that file (append-only, one writer per line);
otherwise to the service's own log as the `agentmesh.audit` logger. Secrets are never
written: callers pass ids and names, never tokens (a refused token is named by a fingerprint).
"""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path
from typing import Any, TextIO

import structlog
from opentelemetry import trace

from agentmesh.logs import get_logger
from agentmesh.rpc.identity import Principal

__all__ = ["AuditLog", "fingerprint"]


def fingerprint(token: str) -> str:
    """Names a credential in a log without revealing it."""
    return hashlib.sha256(token.encode()).hexdigest()[:12]


class _LockedFile:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - lives with the service
        self._lock = threading.Lock()

    def write(self, text: str) -> None:
        with self._lock:
            self._file.write(text)

    def flush(self) -> None:
        with self._lock:
            self._file.flush()

    def close(self) -> None:
        self._file.close()


class AuditLog:
    def __init__(self, service: str, path: Path | None = None):
        self.service = service
        self.path = path
        self._file = _LockedFile(path) if path else None
        if self._file is not None:
            self._logger: Any = structlog.wrap_logger(
                structlog.PrintLogger(self._file),  # type: ignore[arg-type]  # a file-like writer
                processors=[structlog.processors.JSONRenderer(sort_keys=True)],
                wrapper_class=structlog.BoundLogger,
            )
        else:
            self._logger = get_logger("agentmesh.audit")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def record(self, action: str, outcome: str = "allowed", principal: Principal | None = None, **fields: Any) -> None:
        """One line: `action` (e.g. "session.delete"), `outcome` ("allowed" | "refused" |
        "not_found"), who, and what (`fields`: ids, names, the reason)."""
        span = trace.get_current_span()
        context = span.get_span_context()
        entry: dict[str, Any] = {
            "audit": True,
            "action": action,
            "outcome": outcome,
            "service": f"agentmesh-{self.service}",
            "principal": principal.subject if principal else "",
            "tenants": principal.tenant if principal else "",
            "via": principal.via if principal else "",
            "trace_id": format(context.trace_id, "032x") if context.is_valid else "",
            **{key: value for key, value in fields.items() if value is not None},
        }
        if self._file is not None:
            self._logger.info("audit", ts=round(time.time(), 3), **entry)
        else:
            self._logger.info("audit", **{k: v for k, v in entry.items() if k != "trace_id"})
        if span.is_recording():
            span.set_attribute("agentmesh.audit.action", action)
            span.set_attribute("agentmesh.audit.outcome", outcome)
            span.add_event("audit", {k: str(v) for k, v in entry.items() if k not in ("audit", "trace_id")})
