"""Small in-test implementations of the agent loop's ports, and a telemetry that keeps what it records."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Sequence

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentmesh.agent.loop.ports import MemoryHit, NotSupported
from agentmesh.agent.loop.run import TurnRun
from agentmesh.agent.types import ChatMessage, RunEvent, ToolCall, ToolOutcome, ToolSpec
from agentmesh.errors import Unavailable
from agentmesh.telemetry import Telemetry

OBJECT = {"type": "object", "properties": {}}

Handler = Callable[[ToolCall], Awaitable[ToolOutcome]]


async def cancel_once(run: TurnRun, ready: Awaitable[object], timeout_s: float = 10) -> list[RunEvent]:
    """Stream `run`'s events in the background, cancel it once `ready` is done, and return every
    event it sent (the last one says how the turn ended)."""
    events: list[RunEvent] = []

    async def consume() -> None:
        async for event in run.events():
            events.append(event)

    consumer = asyncio.create_task(consume())
    await asyncio.wait_for(ready, timeout_s)
    run.cancel()
    await asyncio.wait_for(consumer, timeout_s)
    return events


def ok(call: ToolCall, output: str) -> ToolOutcome:
    return ToolOutcome(call_id=call.call_id, name=call.name, output=output)


class FakeTools:
    """A tool catalog whose tools are async functions; records every call and every cancellation."""

    def __init__(self, handlers: dict[str, Handler], *, catalog_down: bool = False):
        self.handlers = handlers
        self.catalog_down = catalog_down
        self.calls: list[ToolCall] = []
        self.cancelled: list[str] = []
        self.started: dict[str, asyncio.Event] = {name: asyncio.Event() for name in handlers}

    async def list_tools(self, namespace: str = "", *, mcp_version: float | None = None) -> list[ToolSpec]:
        if self.catalog_down:
            raise Unavailable("the tools service at 127.0.0.1:1 did not list its tools (connection refused)")
        return [ToolSpec(name, f"the {name} tool", OBJECT) for name in self.handlers]

    async def execute(self, session_id: str, call: ToolCall, namespace: str = "", *,
                      mcp_version: float | None = None, sandbox_template: str = "", isolation: str = "") -> ToolOutcome:
        self.calls.append(call)
        self.started[call.name].set()
        try:
            return await self.handlers[call.name](call)
        except asyncio.CancelledError:
            self.cancelled.append(call.call_id)
            raise


class FakeTranscripts:
    """Keeps each append as one batch, so tests can see that every step was saved on its own."""

    def __init__(self, history: dict[str, list[ChatMessage]] | None = None):
        self.history = {k: list(v) for k, v in (history or {}).items()}
        self.batches: list[list[ChatMessage]] = []

    async def load(self, session_id: str) -> list[ChatMessage]:
        return list(self.history.get(session_id, []))

    async def append(self, session_id: str, messages: Sequence[ChatMessage]) -> None:
        self.batches.append(list(messages))
        self.history.setdefault(session_id, []).extend(messages)


@dataclass
class FakeMemory:
    memories: list[tuple[str, str, str]] = field(default_factory=list)  # (namespace, text, kind)
    unsupported: bool = False
    searches: list[tuple[str, str, int]] = field(default_factory=list)

    async def remember(self, namespace: str, text: str, kind: str, source_session_id: str) -> MemoryHit:
        if self.unsupported:
            raise NotSupported("the memory service does not implement long-term memory yet")
        self.memories.append((namespace, text, kind))
        return MemoryHit(id=f"m{len(self.memories)}", text=text, kind=kind, score=0.0)

    async def search(self, namespace: str, query: str, k: int) -> list[MemoryHit]:
        if self.unsupported:
            raise NotSupported("the memory service does not implement long-term memory yet")
        self.searches.append((namespace, query, k))
        words = set(query.lower().split())
        hits = [
            MemoryHit(id=f"m{i + 1}", text=text, kind=kind, score=len(words & set(text.lower().split())) / (len(words) or 1))
            for i, (ns, text, kind) in enumerate(self.memories)
            if ns == namespace and words & set(text.lower().split())
        ]
        return sorted(hits, key=lambda h: -h.score)[:k]


class RecordingTelemetry(Telemetry):
    """Telemetry whose spans and metrics stay in memory for assertions."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.metric_reader = InMemoryMetricReader()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        super().__init__("agent", tracer_provider, MeterProvider(metric_readers=[self.metric_reader]))

    def finished_spans(self):
        return list(self.spans.get_finished_spans())

    def metric_points(self, name: str) -> list:
        data = self.metric_reader.get_metrics_data()
        points = []
        for rm in data.resource_metrics if data else []:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name == name:
                        points.extend(metric.data.data_points)
        return points
