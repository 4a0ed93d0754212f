"""Reading traces back from the local span store and drawing them as a terminal waterfall.

    view = load_trace(span_store_dir(home), trace_id)     # or last_trace_id(...)
    print(render_waterfall(view, width=100))

A trace's spans form a tree through `parent_span_id`. A span whose parent is not in the
store (still open, lost, or started outside agentmesh) is shown at the top level and flagged,
because that is exactly what someone debugging a turn needs to notice.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

__all__ = [
    "AmbiguousTraceId",
    "SpanNode",
    "TraceNotFound",
    "TraceView",
    "format_duration",
    "last_trace_id",
    "load_trace",
    "normalize_trace_id",
    "recent_traces",
    "render_waterfall",
    "short_service",
]

_HEX = re.compile(r"^[0-9a-f]+$")
_MIN_PREFIX = 8


class TraceNotFound(LookupError):
    """No span of the asked-for trace is in the store."""


class AmbiguousTraceId(LookupError):
    """A trace id prefix matches several traces."""


def normalize_trace_id(text: str) -> str:
    """A full 32-hex trace id or a prefix of at least 8; ValueError in words otherwise."""
    value = text.strip().lower()
    if not value or not _HEX.match(value) or len(value) > 32:
        raise ValueError(f"{text!r} is not a trace id: expected up to 32 hexadecimal characters")
    if len(value) < 32 and len(value) < _MIN_PREFIX:
        raise ValueError(f"trace id prefix {text!r} is too short: give at least {_MIN_PREFIX} characters")
    return value


@dataclass
class SpanNode:
    span: dict[str, Any]
    children: list["SpanNode"] = field(default_factory=list)
    orphan: bool = False  # its parent span is not in the store

    @property
    def duration(self) -> float:
        return max(float(self.span.get("end", 0)) - float(self.span.get("start", 0)), 0.0)


@dataclass
class TraceView:
    trace_id: str
    roots: list[SpanNode]

    def walk(self) -> Iterator[tuple[SpanNode, int, tuple[bool, ...]]]:
        """Depth-first in start order: (node, depth, for each ancestor level whether it was the last child)."""

        def visit(node: SpanNode, depth: int, lasts: tuple[bool, ...]) -> Iterator[tuple[SpanNode, int, tuple[bool, ...]]]:
            yield node, depth, lasts
            for i, child in enumerate(node.children):
                yield from visit(child, depth + 1, (*lasts, i == len(node.children) - 1))

        for root in self.roots:
            yield from visit(root, 0, ())

    @property
    def spans(self) -> list[dict[str, Any]]:
        return [node.span for node, _, _ in self.walk()]

    @property
    def start(self) -> float:
        return min(float(s["start"]) for s in self.spans)

    @property
    def end(self) -> float:
        return max(float(s["end"]) for s in self.spans)

    @property
    def duration(self) -> float:
        return max(self.end - self.start, 0.0)

    @property
    def services(self) -> list[str]:
        return sorted({s.get("service", "") for s in self.spans})

    @property
    def errors(self) -> list[dict[str, Any]]:
        return [s for s in self.spans if s.get("status") == "ERROR"]


def _span_lines(directory: Path, needle: str | None = None) -> Iterable[dict[str, Any]]:
    directory = Path(directory)
    if not directory.is_dir():
        return
    for path in sorted(directory.glob("*.jsonl")):
        try:
            with path.open(encoding="utf-8") as lines:
                for line in lines:
                    if needle is not None and needle not in line:
                        continue  # cheap filter before parsing: stores hold many traces
                    try:
                        yield json.loads(line)
                    except json.JSONDecodeError:
                        continue  # a torn line from a process that died mid-write
        except OSError:
            continue  # a file pruned or rotated while we read


def _build_tree(trace_id: str, spans: Iterable[dict[str, Any]]) -> TraceView:
    by_id: dict[str, SpanNode] = {}
    for span in spans:
        # A span exported twice (a retried batch) counts once.
        by_id.setdefault(span["span_id"], SpanNode(span))
    roots = []
    for node in by_id.values():
        parent_id = node.span.get("parent_span_id") or ""
        parent = by_id.get(parent_id)
        if parent is not None and parent is not node:
            parent.children.append(node)
        else:
            node.orphan = bool(parent_id)
            roots.append(node)
    def key(n: SpanNode) -> tuple[float, float]:
        return (n.span.get("start", 0), -n.span.get("end", 0))

    for node in by_id.values():
        node.children.sort(key=key)
    roots.sort(key=key)
    return TraceView(trace_id, roots)


def load_trace(directory: Path, trace_id: str) -> TraceView:
    """The trace with this id (or unique id prefix); TraceNotFound / AmbiguousTraceId otherwise."""
    wanted = normalize_trace_id(trace_id)
    spans = [s for s in _span_lines(directory, f'"trace_id":"{wanted}') if s.get("trace_id", "").startswith(wanted)]
    if not spans:
        raise TraceNotFound(f"no trace {trace_id} in the local span store at {directory}")
    ids = {s["trace_id"] for s in spans}
    if len(ids) > 1:
        raise AmbiguousTraceId(
            f"trace id prefix {trace_id} matches {len(ids)} traces; give more characters "
            f"(for example {sorted(ids)[0]})"
        )
    full = ids.pop()
    return _build_tree(full, spans)


def last_trace_id(directory: Path) -> str | None:
    """The trace whose root span ended last (None when the store is empty)."""
    best: tuple[float, str] | None = None
    for span in _span_lines(directory, '"parent_span_id":""'):
        if span.get("parent_span_id"):
            continue
        candidate = (span.get("end", 0), span.get("trace_id", ""))
        if best is None or candidate > best:
            best = candidate
    if best is None:
        # Only child spans stored (their roots live elsewhere): the latest span's trace.
        for span in _span_lines(directory):
            candidate = (span.get("end", 0), span.get("trace_id", ""))
            if best is None or candidate > best:
                best = candidate
    return best[1] if best else None


def recent_traces(directory: Path, limit: int = 20) -> list[dict[str, Any]]:
    """Summaries of the latest traces by root end time: trace_id, name, service, start, end, spans, errors."""
    summaries: dict[str, dict[str, Any]] = {}
    for span in _span_lines(directory):
        info = summaries.setdefault(span["trace_id"], {"trace_id": span["trace_id"], "name": "", "service": "",
                                                       "start": span["start"], "end": span["end"],
                                                       "spans": 0, "errors": 0})
        info["spans"] += 1
        info["errors"] += span.get("status") == "ERROR"
        info["start"] = min(info["start"], span["start"])
        info["end"] = max(info["end"], span["end"])
        if not span.get("parent_span_id"):
            info["name"], info["service"] = span["name"], span.get("service", "")
    return sorted(summaries.values(), key=lambda s: s["end"], reverse=True)[:limit]


# --- drawing --------------------------------------------------------------------------------


def format_duration(seconds: float) -> str:
    if seconds < 0.001:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms" if seconds < 0.01 else f"{seconds * 1e3:.0f} ms"
    if seconds < 60:
        return f"{seconds:.2f} s"
    return f"{int(seconds // 60)} min {seconds % 60:.0f} s"


def short_service(service: str) -> str:
    return service.removeprefix("agentmesh-")


def _tree_prefix(lasts: tuple[bool, ...], ascii_only: bool) -> str:
    if not lasts:
        return ""
    pipe, tee, elbow = ("|  ", "|- ", "`- ") if ascii_only else ("│  ", "├─ ", "└─ ")
    inner = "".join("   " if last else pipe for last in lasts[:-1])
    return inner + (elbow if lasts[-1] else tee)


def _bar(start: float, end: float, t0: float, total: float, width: int, ascii_only: bool) -> str:
    if total <= 0:
        offset, length = 0, width
    else:
        offset = min(int((start - t0) / total * width), width - 1)
        length = max(1, round((end - start) / total * width))
        length = min(length, width - offset)
    fill, empty = ("#", " ") if ascii_only else ("█", " ")
    return (empty * offset + fill * length).ljust(width)


def render_waterfall(view: TraceView, width: int = 120, ascii_only: bool = False) -> str:
    """The trace as text: a header, then one row per span (service, name, duration, status, bar)."""
    rows = list(view.walk())
    t0, total = view.start, view.duration
    names = [
        _tree_prefix(lasts, ascii_only) + node.span["name"] + (" (parent not recorded)" if node.orphan else "")
        for node, _, lasts in rows
    ]
    service_w = max([len("service")] + [len(short_service(n.span.get("service", ""))) for n, _, _ in rows])
    name_w = min(max([len("span")] + [len(n) for n in names]), 56)
    fixed = service_w + name_w + 10 + 7 + 6  # columns + duration + status + gaps
    bar_w = max(width - fixed, 10)

    errors = view.errors
    header = (
        f"trace {view.trace_id} · {format_duration(total)} · {len(rows)} span{'s' * (len(rows) != 1)}"
        f" · {len(view.services)} service{'s' * (len(view.services) != 1)}"
        + (f" · {len(errors)} error{'s' * (len(errors) != 1)}" if errors else "")
    )
    scale = f"0{format_duration(total).rjust(bar_w - 1)}" if bar_w > 12 else ""
    lines = [
        header,
        f"{'service':<{service_w}}  {'span':<{name_w}}  {'duration':>10}  {'status':<6} {scale}".rstrip(),
    ]
    for (node, _, lasts), full_name in zip(rows, names, strict=True):
        span = node.span
        name = full_name if len(full_name) <= name_w else full_name[: name_w - 1] + ("~" if ascii_only else "…")
        status = "ERROR" if span.get("status") == "ERROR" else "ok"
        lines.append(
            f"{short_service(span.get('service', '')):<{service_w}}  {name:<{name_w}}  "
            f"{format_duration(node.duration):>10}  {status:<6} "
            f"{_bar(span['start'], span['end'], t0, total, bar_w, ascii_only)}".rstrip()
        )
        if status == "ERROR" and span.get("status_message"):
            indent = " " * (service_w + 2 + len(_tree_prefix(lasts, ascii_only)) + 3)
            lines.append(f"{indent}! {span['status_message'][:200]}")
    text = "\n".join(lines)
    return text.replace("·", "-").replace("µ", "u") if ascii_only else text
