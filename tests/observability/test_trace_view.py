"""Reading a trace back from the store, its tree, the waterfall, and `agentmesh trace show|list`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from agentmesh.config import Settings
from agentmesh.telemetry import setup_telemetry
from agentmesh.telemetry.spanstore import span_store_dir
from agentmesh.telemetry.traceview import (
    AmbiguousTraceId,
    TraceNotFound,
    last_trace_id,
    load_trace,
    normalize_trace_id,
    recent_traces,
    render_waterfall,
)

T0 = 1_700_000_000 * 10**9  # ns
MS = 10**6


def write_turn(home, start_ms: int = 0, fail_tool: bool = True) -> str:
    """A stored turn across gateway, agent and tools with fixed times; returns its trace id."""
    settings = Settings.from_env({"AGENTMESH_HOME": str(home), "AGENTMESH_TRACES": "local"})
    services = {name: setup_telemetry(name, settings) for name in ("gateway", "agent", "tools")}

    def span(service, name, parent, begin, end, error=""):
        ctx = trace.set_span_in_context(parent) if parent is not None else None
        s = services[service].tracer.start_span(name, context=ctx, start_time=T0 + (start_ms + begin) * MS)
        if error:
            s.set_status(Status(StatusCode.ERROR, error))
        s.end(end_time=T0 + (start_ms + end) * MS)
        return s

    # Children end before their parents, as in life; parents are passed before they end.
    root = services["gateway"].tracer.start_span("/agentmesh.v1.Gateway/Chat", start_time=T0 + start_ms * MS)
    run = services["agent"].tracer.start_span(
        "/agentmesh.internal.v1.Agent/RunTurn", context=trace.set_span_in_context(root), start_time=T0 + (start_ms + 50) * MS
    )
    invoke = services["agent"].tracer.start_span(
        "invoke_agent", context=trace.set_span_in_context(run), start_time=T0 + (start_ms + 60) * MS
    )
    span("agent", "chat test-model", invoke, 100, 400)
    tool = services["agent"].tracer.start_span(
        "execute_tool shell", context=trace.set_span_in_context(invoke), start_time=T0 + (start_ms + 450) * MS
    )
    span("tools", "/agentmesh.internal.v1.Tools/Execute", tool, 460, 890)
    if fail_tool:
        tool.set_status(Status(StatusCode.ERROR, "command exited with status 1"))
    tool.end(end_time=T0 + (start_ms + 900) * MS)
    invoke.end(end_time=T0 + (start_ms + 940) * MS)
    run.end(end_time=T0 + (start_ms + 950) * MS)
    root.end(end_time=T0 + (start_ms + 1000) * MS)
    for telemetry in services.values():
        telemetry.shutdown()
    return format(root.get_span_context().trace_id, "032x")


@pytest.fixture
def store(tmp_path):
    return span_store_dir(tmp_path)


def test_the_tree_follows_parent_links_in_start_order(tmp_path, store):
    trace_id = write_turn(tmp_path)
    view = load_trace(store, trace_id)
    shape = [(depth, node.span["name"]) for node, depth, _ in view.walk()]
    assert shape == [
        (0, "/agentmesh.v1.Gateway/Chat"),
        (1, "/agentmesh.internal.v1.Agent/RunTurn"),
        (2, "invoke_agent"),
        (3, "chat test-model"),
        (3, "execute_tool shell"),
        (4, "/agentmesh.internal.v1.Tools/Execute"),
    ]
    assert view.duration == pytest.approx(1.0)
    assert view.services == ["agentmesh-agent", "agentmesh-gateway", "agentmesh-tools"]
    assert [s["name"] for s in view.errors] == ["execute_tool shell"]


def test_a_prefix_finds_the_trace_and_bad_ids_are_refused(tmp_path, store):
    trace_id = write_turn(tmp_path)
    assert load_trace(store, trace_id[:10].upper()).trace_id == trace_id
    with pytest.raises(TraceNotFound, match="no trace"):
        load_trace(store, "0" * 32)
    for bad in ("xyz", "abc", "0" * 33, ""):
        with pytest.raises(ValueError):
            normalize_trace_id(bad)


def test_an_ambiguous_prefix_is_refused(tmp_path, store):
    store.mkdir(parents=True)
    lines = [
        {"trace_id": "abcdef01" + c * 24, "span_id": c * 16, "parent_span_id": "", "name": "n", "service": "s",
         "start": 1.0, "end": 2.0}
        for c in "12"
    ]
    (store / "x-1.jsonl").write_text("".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines))
    with pytest.raises(AmbiguousTraceId, match="matches 2 traces"):
        load_trace(store, "abcdef01")


def test_last_is_the_trace_whose_root_ended_last(tmp_path, store):
    assert last_trace_id(store) is None
    first = write_turn(tmp_path, start_ms=0)
    later = write_turn(tmp_path, start_ms=5000, fail_tool=False)
    assert last_trace_id(store) == later
    summaries = recent_traces(store)
    assert [s["trace_id"] for s in summaries] == [later, first]
    assert summaries[1]["errors"] == 1 and summaries[0]["errors"] == 0
    assert summaries[0]["spans"] == 6 and summaries[0]["name"] == "/agentmesh.v1.Gateway/Chat"


def test_a_span_whose_parent_is_missing_is_shown_and_flagged(tmp_path, store):
    trace_id = write_turn(tmp_path)
    orphan = {"trace_id": trace_id, "span_id": "f" * 16, "parent_span_id": "e" * 16, "name": "sandbox.run",
              "service": "agentmesh-tools", "start": T0 / 1e9 + 0.5, "end": T0 / 1e9 + 0.6, "status": "OK",
              "attributes": {}}
    with (store / "tools-extra.jsonl").open("a") as out:
        out.write(json.dumps(orphan, separators=(",", ":")) + "\n")
    view = load_trace(store, trace_id)
    assert [n.span["name"] for n in view.roots] == ["/agentmesh.v1.Gateway/Chat", "sandbox.run"]
    assert view.roots[1].orphan
    assert "sandbox.run (parent not recorded)" in render_waterfall(view)


def test_the_waterfall_shows_service_name_duration_status_and_scaled_bars(tmp_path, store):
    view = load_trace(store, write_turn(tmp_path))
    text = render_waterfall(view, width=120)
    lines = text.splitlines()
    assert lines[0].startswith(f"trace {view.trace_id} · 1.00 s · 6 spans · 3 services · 1 error")
    root = next(l for l in lines if "Gateway/Chat" in l)
    model = next(l for l in lines if "chat test-model" in l)
    tool = next(l for l in lines if "execute_tool shell" in l)
    assert root.startswith("gateway") and "1.00 s" in root and " ok " in root
    assert model.startswith("agent") and "300 ms" in model
    assert "ERROR" in tool and "450 ms" in tool
    assert any(l.strip() == "! command exited with status 1" for l in lines)
    # Bars: the root spans the whole width; the model call starts a tenth in and covers 30 %.
    bar_start = root.index("█")
    root_bar = root[bar_start:]
    assert set(root_bar) == {"█"}
    width = len(root_bar)
    model_bar = model[bar_start:]
    assert model_bar.index("█") == int(0.1 * width)
    assert model_bar.count("█") == round(0.3 * width)
    assert "└─ " in text and "├─ " in text


def test_the_waterfall_can_be_plain_ascii(tmp_path, store):
    text = render_waterfall(load_trace(store, write_turn(tmp_path)), width=100, ascii_only=True)
    text.encode("ascii")
    assert "`- " in text and "#" in text


def agentmesh_process(home, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTMESH_", "OTEL_"))}
    env["AGENTMESH_HOME"] = str(home)
    env["COLUMNS"] = "110"
    return subprocess.run([sys.executable, "-m", "agentmesh.cli.main", *args], env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.fixture
def agentmesh(tmp_path, monkeypatch, capsys):
    """The CLI in this process (fast); one test below runs the real executable."""
    from agentmesh.cli.main import main

    for name in [n for n in os.environ if n.startswith(("AGENTMESH_", "OTEL_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AGENTMESH_HOME", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "110")

    def run(*args):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse usage errors
            code = exc.code
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out, err)

    return run


def test_cli_show_list_and_json(tmp_path, agentmesh):
    empty = agentmesh("trace", "show", "--last")
    assert empty.returncode == 1 and "no traces yet" in empty.stderr

    first = write_turn(tmp_path)
    last = write_turn(tmp_path, start_ms=3000, fail_tool=False)

    shown = agentmesh("trace", "show", "--last")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"trace {last}")
    assert "execute_tool shell" in shown.stdout
    assert agentmesh("trace", "show").stdout == shown.stdout  # --last is the default

    by_id = agentmesh("trace", "show", first, "--json")
    assert by_id.returncode == 0, by_id.stderr
    spans = json.loads(by_id.stdout)
    assert len(spans) == 6
    for span in spans:
        assert {"trace_id", "span_id", "parent_span_id", "name", "service", "start", "end", "attributes"} <= span.keys()
        assert span["trace_id"] == first
    assert spans[0]["parent_span_id"] == "" and spans[0]["service"] == "agentmesh-gateway"

    listed = agentmesh("trace", "list")
    assert listed.returncode == 0 and listed.stdout.index(last) < listed.stdout.index(first)
    listed_json = json.loads(agentmesh("trace", "list", "--json", "--limit", "1").stdout)
    assert [t["trace_id"] for t in listed_json] == [last]


def test_cli_errors_are_plain_words_with_the_right_exit_code(tmp_path, agentmesh):
    first = write_turn(tmp_path)
    unknown = agentmesh("trace", "show", "0123456789abcdef0123456789abcdef")
    assert unknown.returncode == 1
    assert "no trace 0123456789abcdef0123456789abcdef" in unknown.stderr and not unknown.stdout

    malformed = agentmesh("trace", "show", "not-a-trace")
    assert malformed.returncode == 2 and "not a trace id" in malformed.stderr

    both = agentmesh("trace", "show", first, "--last")
    assert both.returncode == 2 and "not both" in both.stderr

    no_verb = agentmesh("trace")
    assert no_verb.returncode == 2


def test_the_installed_command_draws_the_last_trace(tmp_path):
    trace_id = write_turn(tmp_path)
    shown = agentmesh_process(tmp_path, "trace", "show", "--last")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"trace {trace_id}")
    unknown = agentmesh_process(tmp_path, "trace", "show", "f" * 32)
    assert unknown.returncode == 1 and "no trace" in unknown.stderr


def test_a_span_exported_twice_is_shown_once(tmp_path, store):
    trace_id = write_turn(tmp_path)
    first_file = sorted(store.glob("*.jsonl"))[0]
    lines = first_file.read_text().splitlines(keepends=True)
    with first_file.open("a") as out:
        out.writelines(lines)  # a retried batch
    assert len(load_trace(store, trace_id).spans) == 6
