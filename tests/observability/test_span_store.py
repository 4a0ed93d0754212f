"""The local span store: what the services write under $AGENTMESH_HOME/traces/ and how it is read back."""

from __future__ import annotations

import json
import os
import time

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from agentmesh.config import Settings
from agentmesh.telemetry import setup_telemetry, traceparent_env
from agentmesh.telemetry.spanstore import LocalSpanExporter, prune_store, read_spans, span_store_dir


def local_settings(home) -> Settings:
    return Settings.from_env({"AGENTMESH_HOME": str(home), "AGENTMESH_TRACES": "local"})


def test_spans_of_two_services_land_in_the_store_with_their_links(tmp_path):
    settings = local_settings(tmp_path)
    gateway, agent = setup_telemetry("gateway", settings), setup_telemetry("agent", settings)
    try:
        with gateway.tracer.start_as_current_span("chat-turn") as root:
            carrier = traceparent_env()
            with agent.tracer.start_as_current_span("invoke_agent", attributes={"gen_ai.agent.name": "a"}) as child:
                child.set_status(Status(StatusCode.ERROR, "model refused"))
                child.add_event("retry", {"attempt": 2})
    finally:
        gateway.shutdown()
        agent.shutdown()

    spans = {s["name"]: s for s in read_spans(span_store_dir(tmp_path))}
    assert set(spans) == {"chat-turn", "invoke_agent"}
    parent, child = spans["chat-turn"], spans["invoke_agent"]
    ctx = root.get_span_context()
    assert parent["trace_id"] == child["trace_id"] == format(ctx.trace_id, "032x")
    assert parent["parent_span_id"] == "" and child["parent_span_id"] == parent["span_id"]
    assert (parent["service"], child["service"]) == ("agentmesh-gateway", "agentmesh-agent")
    assert parent["start"] <= child["start"] <= child["end"] <= parent["end"]
    assert child["status"] == "ERROR" and child["status_message"] == "model refused"
    assert parent["status"] == "OK"
    assert child["attributes"] == {"gen_ai.agent.name": "a"}
    assert child["events"][0]["name"] == "retry" and child["events"][0]["attributes"] == {"attempt": 2}
    # TRACEPARENT for a sandbox carries the trace and the current span.
    assert carrier["TRACEPARENT"].startswith(f"00-{parent['trace_id']}-{parent['span_id']}-")
    # One file per service process.
    assert sorted(p.name for p in span_store_dir(tmp_path).iterdir()) == sorted(
        [f"agent-{os.getpid()}.jsonl", f"gateway-{os.getpid()}.jsonl"]
    )


def test_no_span_outside_a_trace_means_no_traceparent():
    assert trace.get_current_span().get_span_context().is_valid is False
    assert traceparent_env() == {}


def test_tracing_off_writes_nothing(tmp_path):
    settings = Settings.from_env({"AGENTMESH_HOME": str(tmp_path), "AGENTMESH_TRACES": "none"})
    telemetry = setup_telemetry("agent", settings)
    with telemetry.tracer.start_as_current_span("x"):
        assert traceparent_env() == {}
    telemetry.shutdown()
    assert not span_store_dir(tmp_path).exists()


def test_torn_lines_are_skipped(tmp_path):
    directory = span_store_dir(tmp_path)
    directory.mkdir(parents=True)
    good = {"trace_id": "a" * 32, "span_id": "b" * 16, "parent_span_id": "", "name": "n", "start": 1, "end": 2}
    (directory / "agent-1.jsonl").write_text(json.dumps(good) + "\n" + '{"trace_id": "tor', encoding="utf-8")
    assert list(read_spans(directory)) == [good]
    assert list(read_spans(tmp_path / "missing")) == []


def test_a_full_file_is_rotated_once(tmp_path):
    settings = local_settings(tmp_path)
    telemetry = setup_telemetry("tools", settings)
    exporter = LocalSpanExporter(tmp_path / "store", "tools", max_bytes=2000)
    spans = []
    for i in range(30):
        span = telemetry.tracer.start_span(f"span-{i}")
        span.end()
        spans.append(span)
    for span in spans:
        exporter.export([span])
    telemetry.shutdown()
    files = sorted(p.name for p in (tmp_path / "store").iterdir())
    assert files == [f"tools-{os.getpid()}.jsonl", f"tools-{os.getpid()}.old.jsonl"]
    assert all(p.stat().st_size <= 2000 + 1000 for p in (tmp_path / "store").iterdir())
    names = {s["name"] for s in read_spans(tmp_path / "store")}
    assert "span-29" in names and len(names) < 30  # the oldest were dropped


def test_prune_removes_only_files_not_written_for_a_while(tmp_path):
    old, fresh = tmp_path / "agent-1.jsonl", tmp_path / "agent-2.jsonl"
    old.write_text("{}\n")
    fresh.write_text("{}\n")
    week_ago = time.time() - 8 * 86400
    os.utime(old, (week_ago, week_ago))
    assert prune_store(tmp_path, 7 * 86400) == 1
    assert not old.exists() and fresh.exists()
