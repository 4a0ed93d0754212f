"""Run chat turns on the real five-service stack and keep everything observability cares about.

Shared by the end-to-end trace test and `benches/tracing.py`. The stack and the scripted model
server are the lead's and the agent engineer's fixtures (tests/support); nothing is stubbed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from agentmesh.logs import secrets_of
from agentmesh.telemetry.metricstore import metric_store_dir, read_metric_points
from agentmesh.telemetry.spanstore import read_spans, span_store_dir
from agentmesh.v1 import gateway_pb2
from tests.observability.obs_helpers import capture_logs
from tests.support.llm_server import ScriptedLLMServer
from tests.support.stack import Stack


@dataclass
class TurnRecord:
    events: list
    trace_id: str
    spans: list[dict]
    log_lines: list[dict]
    log_text: str
    llm_requests: list
    metric_points: list[dict]
    store_text: str = ""
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)

    def of_kind(self, kind: str) -> list:
        return [getattr(e, kind) for e in self.events if e.WhichOneof("payload") == kind]

    def spans_of(self, trace_id: str | None = None) -> list[dict]:
        wanted = trace_id or self.trace_id
        return [s for s in self.spans if s["trace_id"] == wanted]


async def chat(stack: Stack, session_id: str, message: str) -> list:
    request = gateway_pb2.ChatRequest(session_id=session_id, message=message)
    return [event async for event in stack.gateway_stub().Chat(request, timeout=60)]


def _trace_id_of(events) -> str:
    for event in events:
        kind = event.WhichOneof("payload")
        if kind == "run_finished" and event.run_finished.trace_id:
            return event.run_finished.trace_id
        if kind == "run_started" and event.run_started.trace_id:
            return event.run_started.trace_id
    return ""


async def capture_turn(home: Path, steps: Sequence, message: str, env: Mapping[str, str] | None = None) -> TurnRecord:
    """One turn on a fresh stack; the stack is stopped (so every exporter flushed) before reading."""
    with ScriptedLLMServer(steps) as llm:
        stack = Stack(home, llm_base_url=llm.base_url, env=env)
        with capture_logs("stack", secrets=secrets_of(stack.settings)) as logs:
            await stack.start()
            try:
                started = time.perf_counter()
                events = await chat(stack, "obs-e2e", message)
                seconds = time.perf_counter() - started
            finally:
                await stack.stop()
            requests = list(llm.requests)
            lines, text = logs.lines(), logs.text
    store = span_store_dir(home)
    store_text = "".join(p.read_text(encoding="utf-8") for p in sorted(store.glob("*.jsonl"))) if store.is_dir() else ""
    return TurnRecord(
        events=events,
        trace_id=_trace_id_of(events),
        spans=list(read_spans(store)),
        log_lines=lines,
        log_text=text,
        llm_requests=requests,
        metric_points=list(read_metric_points(metric_store_dir(home))),
        store_text=store_text,
        seconds=seconds,
    )
