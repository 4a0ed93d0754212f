"""The local span store: finished spans as JSON lines under `$AGENTMESH_HOME/traces/`.

One file per service process avoids interleaved writes between processes; readers merge them.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import StatusCode

__all__ = ["LocalSpanExporter", "prune_store", "read_jsonl_dir", "read_spans", "span_store_dir"]


def span_store_dir(home: Path) -> Path:
    return Path(home) / "traces"


_ENCODE = json.JSONEncoder(separators=(",", ":")).encode


def _span_to_dict(span: ReadableSpan) -> dict[str, Any]:
    ctx = span.get_span_context()
    assert ctx is not None  # an SDK span always has one
    parent = span.parent
    return {
        "trace_id": format(ctx.trace_id, "032x"),
        "span_id": format(ctx.span_id, "016x"),
        "parent_span_id": format(parent.span_id, "016x") if parent else "",
        "name": span.name,
        "service": span.resource.attributes.get("service.name", ""),
        "kind": span.kind.name,
        "start": (span.start_time or 0) / 1e9,
        "end": (span.end_time or 0) / 1e9,
        "status": span.status.status_code.name if span.status.status_code != StatusCode.UNSET else "OK",
        "status_message": span.status.description or "",
        "attributes": {k: _jsonable(v) for k, v in (span.attributes or {}).items()},
        "events": [
            {"name": e.name, "time": e.timestamp / 1e9, "attributes": {k: _jsonable(v) for k, v in (e.attributes or {}).items()}}
            for e in span.events
        ],
    }


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return list(value)


class LocalSpanExporter(SpanExporter):
    """Appends finished spans to `<service>-<pid>.jsonl`; past `max_bytes` the file is rotated
    once to `<service>-<pid>.old.jsonl`, so one process keeps at most twice that on disk."""

    def __init__(self, directory: Path, service: str, max_bytes: int = 64 * 1024 * 1024):
        self._path = Path(directory) / f"{service}-{os.getpid()}.jsonl"
        self._rotated = self._path.with_name(f"{service}-{os.getpid()}.old.jsonl")
        self._max_bytes = max_bytes
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join([_ENCODE(_span_to_dict(s)) + "\n" for s in spans])
        try:
            with self._lock:
                try:
                    out = self._path.open("a", encoding="utf-8")
                except FileNotFoundError:  # made on the first export, or removed since
                    self._path.parent.mkdir(parents=True, exist_ok=True)
                    out = self._path.open("a", encoding="utf-8")
                with out:
                    out.write(lines)
                    size = out.tell()
                if size > self._max_bytes:
                    os.replace(self._path, self._rotated)
        except OSError:
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def prune_store(directory: Path, max_age_s: float, now: float | None = None) -> int:
    """Delete store files (spans or metrics) not written for `max_age_s`; returns how many."""
    directory = Path(directory)
    if not directory.is_dir():
        return 0
    now = time.time() if now is None else now
    removed = 0
    for path in directory.glob("*.jsonl"):
        try:
            if now - path.stat().st_mtime > max_age_s:
                path.unlink()
                removed += 1
        except OSError:
            continue  # another process pruned it first
    return removed


def read_spans(directory: Path) -> Iterable[dict[str, Any]]:
    """Every stored span, in no particular order; torn last lines are skipped."""
    return read_jsonl_dir(directory)


def read_jsonl_dir(directory: Path) -> Iterable[dict[str, Any]]:
    """Every JSON line of every `*.jsonl` file in `directory`, file by file; torn lines are skipped."""
    directory = Path(directory)
    if not directory.is_dir():
        return
    for path in sorted(directory.glob("*.jsonl")):
        with path.open(encoding="utf-8") as lines:
            for line in lines:
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    continue
