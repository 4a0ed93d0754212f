"""One chat turn across the five real services: one complete trace, GenAI attributes, error
status on a failing tool, metrics from every hop, and no secret in any log line.

The turn: the model asks for two shell calls — one prints the sandbox's TRACEPARENT, the other
fails with exit status 3 — then answers. The stack is stopped before reading the local stores,
so every exporter has flushed.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.observability.turn_capture import TurnRecord, capture_turn
from tests.support.llm_server import failure, reply, tool_call

# One worker runs the module: its turn (a whole stack) is captured once, not per worker.
pytestmark = pytest.mark.xdist_group("turn-trace")

API_KEY = "am-e2e-KEY-4f1c9b7d2e8a"  # not shaped like any known key: only configuration can hide it
GOOD = 'echo "tp=$TRACEPARENT"'
BAD = "echo failing >&2; exit 3"


@pytest.fixture(scope="module")
def turn(tmp_path_factory) -> TurnRecord:
    steps = [
        # A transient failure whose body quotes the key, so the retry path is logged too.
        failure(503, message=f"overloaded (key {API_KEY} is fine, try again)"),
        reply("Running both.", tool_call("shell", {"command": GOOD}, id="call_good"),
              tool_call("shell", {"command": BAD}, id="call_bad"), usage=(42, 7)),
        reply("One worked, one failed.", usage=(60, 9)),
    ]
    home = tmp_path_factory.mktemp("obs-e2e") / "home"
    return asyncio.run(capture_turn(home, steps, "run the two commands", env={"AGENTMESH_LLM_API_KEY": API_KEY}))


def by_name(spans: list[dict]) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for span in spans:
        found.setdefault(span["name"], []).append(span)
    return found


def one(spans: list[dict], predicate, what: str) -> dict:
    matches = [s for s in spans if predicate(s)]
    assert len(matches) == 1, f"expected one {what} span, found {len(matches)}: {[s['name'] for s in spans]}"
    return matches[0]


def ancestors(span: dict, index: dict[str, dict]) -> list[dict]:
    chain = []
    while span.get("parent_span_id") in index:
        span = index[span["parent_span_id"]]
        chain.append(span)
    return chain


def test_the_turn_finished_and_used_the_key(turn):
    assert turn.of_kind("run_finished"), [e.WhichOneof("payload") for e in turn.events]
    assert turn.of_kind("run_finished")[0].final_text == "One worked, one failed."
    assert turn.trace_id and len(turn.trace_id) == 32
    # The key really was in play: the model server saw it.
    assert turn.llm_requests[0].headers["authorization"] == f"Bearer {API_KEY}"


def test_one_trace_holds_every_span_of_the_turn(turn):
    turn_services = {"agentmesh-gateway", "agentmesh-agent", "agentmesh-tools", "agentmesh-memory"}
    ours = turn.spans_of()
    begins, ends = min(s["start"] for s in ours), max(s["end"] for s in ours)
    # Work of the services' own (the gateway resuming pending webhook deliveries as it starts) is
    # a trace of its own; a span of the services during the turn that is not in its trace is stray.
    stray = [s for s in turn.spans if s["service"] in turn_services and s["trace_id"] != turn.trace_id
             and s["end"] >= begins and s["start"] <= ends]
    assert not stray, f"spans of the turn outside its trace: {[(s['service'], s['name']) for s in stray]}"
    spans = turn.spans_of()
    assert {s["service"] for s in spans} >= turn_services


def test_parent_links_form_one_tree_with_no_span_left_open(turn):
    spans = turn.spans_of()
    index = {s["span_id"]: s for s in spans}
    assert len(index) == len(spans), "a span was exported twice"
    roots = [s for s in spans if not s["parent_span_id"]]
    assert [r["name"] for r in roots] == ["/agentmesh.v1.Gateway/Chat"]
    # A span that never ended is never exported, so its children would point at nothing.
    orphans = [s["name"] for s in spans if s["parent_span_id"] and s["parent_span_id"] not in index]
    assert not orphans, f"spans whose parent was never recorded (left open?): {orphans}"
    for span in spans:
        assert 0 < span["start"] <= span["end"], span["name"]
        parent = index.get(span["parent_span_id"])
        if parent is not None:
            assert span["start"] >= parent["start"] - 0.001, (span["name"], parent["name"])


def test_the_spans_cover_gateway_agent_model_tools_sandbox_and_memory(turn):
    spans = turn.spans_of()
    index = {s["span_id"]: s for s in spans}
    names = by_name(spans)

    invoke = one(spans, lambda s: s["name"] == "invoke_agent", "invoke_agent")
    assert "/agentmesh.v1.Gateway/Chat" in [a["name"] for a in ancestors(invoke, index)]
    assert "/agentmesh.internal.v1.Agent/RunTurn" in [a["name"] for a in ancestors(invoke, index)]

    chats = names.get("chat test-model", [])
    assert len(chats) == 2, sorted(names)
    assert all(c["parent_span_id"] == invoke["span_id"] for c in chats)

    # The HTTP call to the model is a child of the model-call span and carried the trace on the wire.
    http = [s for s in spans if s["kind"] == "CLIENT" and s["parent_span_id"] in {c["span_id"] for c in chats}]
    assert http, "no instrumented HTTP span under the chat spans"
    for request in turn.llm_requests:
        assert request.headers.get("traceparent", "").split("-")[1] == turn.trace_id

    tools = names.get("execute_tool shell", [])
    assert len(tools) == 2 and all(t["parent_span_id"] == invoke["span_id"] for t in tools)
    executes = names.get("/agentmesh.internal.v1.Tools/Execute", [])
    executes = [e for e in executes if e["service"] == "agentmesh-tools"]
    assert len(executes) == 2
    for execute in executes:
        assert any(a["name"] == "execute_tool shell" for a in ancestors(execute, index))

    sandboxes = [s for s in spans if s["name"].startswith("sandbox")]
    assert len(sandboxes) >= 2, sorted(names)
    for sandbox in sandboxes:
        assert sandbox["service"] == "agentmesh-tools"
        assert any(a["name"] == "/agentmesh.internal.v1.Tools/Execute" for a in ancestors(sandbox, index))

    memory = [s for s in spans if s["service"] == "agentmesh-memory"]
    assert memory, "no memory span in the trace"
    # Everything the memory service does is the turn's: the gateway calls it no more before the
    # agent runs (the agent's StartTurn opens the session). The one exception is the run's record
    # (gateway/runs.py), which the gateway writes from a background task beside the turn.
    run_records = {"/agentmesh.internal.v1.Memory/PutRunRecords", "/agentmesh.internal.v1.Memory/GetNamespaceWebhook"}
    assert all(any(a["name"] == "invoke_agent" or a["name"].endswith("RunTurn") or a["name"] in run_records
                   for a in [m, *ancestors(m, index)])
               for m in memory), sorted({m["name"] for m in memory})
    # The turn's recall: its own Search call, or inside StartTurn (the transcript read, the user's
    # message and recall in one call), with the store's hybrid query beneath it.
    assert any("Search" in m["name"] or "StartTurn" in m["name"] for m in memory), sorted({m["name"] for m in memory})
    assert any(m["name"] == "memory.hybrid_query" for m in memory), sorted({m["name"] for m in memory})


def test_the_sandboxed_process_received_the_trace_context(turn):
    results = {r.result.call_id: r.result for r in turn.of_kind("tool_result")}
    good = results["call_good"]
    assert not good.is_error
    assert f"tp=00-{turn.trace_id}-" in good.stdout, good.stdout


def test_genai_attributes_are_present(turn):
    spans = turn.spans_of()
    invoke = one(spans, lambda s: s["name"] == "invoke_agent", "invoke_agent")
    assert invoke["attributes"]["gen_ai.operation.name"] == "invoke_agent"
    assert invoke["attributes"].get("gen_ai.agent.name")
    assert invoke["attributes"]["gen_ai.usage.input_tokens"] == 42 + 60
    assert invoke["attributes"]["gen_ai.usage.output_tokens"] == 7 + 9

    chats = sorted((s for s in spans if s["name"] == "chat test-model"), key=lambda s: s["start"])
    for span, (inp, out) in zip(chats, [(42, 7), (60, 9)], strict=True):
        attributes = span["attributes"]
        assert attributes["gen_ai.operation.name"] == "chat"
        assert attributes["gen_ai.request.model"] == "test-model"
        assert (attributes["gen_ai.usage.input_tokens"], attributes["gen_ai.usage.output_tokens"]) == (inp, out)
    # The retried 503 is visible on the first model call.
    assert any(e["name"] == "retry" for e in chats[0]["events"])

    tool_calls = {s["attributes"]["gen_ai.tool.call.id"]: s for s in spans if s["name"] == "execute_tool shell"}
    assert set(tool_calls) == {"call_good", "call_bad"}
    assert all(s["attributes"]["gen_ai.tool.name"] == "shell" for s in tool_calls.values())


def test_a_failing_tool_marks_its_span_as_an_error(turn):
    spans = turn.spans_of()
    tools = {s["attributes"]["gen_ai.tool.call.id"]: s for s in spans if s["name"] == "execute_tool shell"}
    assert tools["call_bad"]["status"] == "ERROR"
    assert tools["call_good"]["status"] == "OK"
    # The turn itself succeeded.
    assert one(spans, lambda s: s["name"] == "invoke_agent", "invoke_agent")["status"] == "OK"
    results = {r.result.call_id: r.result for r in turn.of_kind("tool_result")}
    assert results["call_bad"].is_error and results["call_bad"].exit_code == 3


def test_metrics_were_recorded_on_every_hop(turn):
    def points(name):
        return [p for p in turn.metric_points if p["name"] == name]

    rpc = {(p["attributes"]["rpc.service"], p["attributes"]["rpc.method"]) for p in points("rpc.server.duration")}
    assert {("agentmesh.v1.Gateway", "Chat"), ("agentmesh.internal.v1.Agent", "RunTurn"), ("agentmesh.internal.v1.Tools", "Execute")} <= rpc
    assert any(service == "agentmesh.internal.v1.Memory" for service, _ in rpc)

    outcomes = {(p["attributes"]["tool"], p["attributes"]["outcome"]) for p in points("agentmesh.tool.duration")}
    assert outcomes == {("shell", "ok"), ("shell", "error")}
    tokens = {p["attributes"]["gen_ai.token.type"]: p["sum"] for p in points("gen_ai.client.token.usage")}
    assert tokens == {"input": 102, "output": 16}
    assert points("gen_ai.client.operation.duration")
    in_flight = [p["value"] for p in points("agentmesh.turns.in_flight")]
    assert in_flight and in_flight[-1] == 0


def test_sandbox_wait_is_recorded(turn):
    waits = [p for p in turn.metric_points if p["name"] == "agentmesh.sandbox.wait"]
    assert waits and waits[-1]["attributes"]["executor"] == "local"
    assert waits[-1]["count"] == 2


def test_no_secret_in_any_log_line(turn):
    assert turn.log_lines, "no log line was captured"
    assert API_KEY not in turn.log_text
    for line in turn.log_lines:
        assert {"trace_id", "span_id", "session_id"} <= line.keys(), line
    # Lines logged during the turn carry its ids.
    turn_lines = [line for line in turn.log_lines if line.get("session_id") == "obs-e2e"]
    assert turn_lines and all(line["trace_id"] == turn.trace_id for line in turn_lines)
    # Nor in the span store (span attributes and events are read by people too).
    assert API_KEY not in turn.store_text
    assert "authorization" not in json.dumps([s["attributes"] for s in turn.spans]).lower()
