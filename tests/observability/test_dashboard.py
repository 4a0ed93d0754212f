"""The Grafana dashboard shipped with the chart queries exactly the metrics the services record,
under the names an OpenTelemetry collector's Prometheus exporter gives them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import promql_parser
import pytest

from agentmesh.telemetry import instruments
from agentmesh.telemetry.instruments import ServiceMetrics
from tests.observability.obs_helpers import memory_telemetry

DASHBOARD = Path(__file__).resolve().parents[2] / "helm" / "agentmesh" / "dashboards" / "agentmesh.json"
UNIT_SUFFIX = {"ms": "milliseconds", "s": "seconds", "By": "bytes"}


def prometheus_base_name(name: str, unit: str) -> str:
    """The collector's default translation: dots to underscores, the unit spelled out as a
    suffix, {annotations} dropped."""
    base = re.sub(r"[^a-zA-Z0-9_:]", "_", name)
    suffix = UNIT_SUFFIX.get(unit, "") if not unit.startswith("{") else ""
    return f"{base}_{suffix}" if suffix else base


def exported_series() -> set[str]:
    """Every Prometheus series name the shared instruments produce."""
    telemetry, _, reader = memory_telemetry("agent")
    metrics: ServiceMetrics = telemetry.metrics
    # Record once on each instrument so the reader reports its unit and kind.
    metrics.rpc_server_duration.record(1, {})
    metrics.record_model_call(model="m", provider="p", seconds=1, input_tokens=1, output_tokens=1)
    metrics.record_tool("t", 1)
    metrics.record_sandbox_wait(1, "local")
    metrics.record_memory_search(1)
    metrics.model_slot_waiting_add("m", 1)
    metrics.record_model_slot_wait("m", 1)
    with metrics.turn_in_flight():
        pass
    names = set()
    for resource_metrics in reader.get_metrics_data().resource_metrics:
        for scope in resource_metrics.scope_metrics:
            for metric in scope.metrics:
                base = prometheus_base_name(metric.name, metric.unit)
                kind = type(metric.data).__name__
                if kind == "Histogram":
                    names |= {f"{base}_bucket", f"{base}_sum", f"{base}_count"}
                elif kind == "Sum" and metric.data.is_monotonic:
                    names.add(f"{base}_total")
                else:
                    names.add(base)
    return names


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def expressions(dashboard: dict) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def queried_metrics(expr: str) -> set[str]:
    names = set(re.findall(r"\b([a-z][a-z0-9_]*)\s*(?=[\[{])", expr))
    names |= set(re.findall(r"\bsum\(([a-z][a-z0-9_]*)\)", expr))
    return names


def test_the_translation_matches_the_documented_examples():
    assert prometheus_base_name(instruments.RPC_SERVER_DURATION, "ms") == "rpc_server_duration_milliseconds"
    assert prometheus_base_name(instruments.GEN_AI_TOKEN_USAGE, "{token}") == "gen_ai_client_token_usage"
    assert prometheus_base_name(instruments.SANDBOX_WAIT, "s") == "agentmesh_sandbox_wait_seconds"


def test_every_queried_metric_is_one_the_services_export(dashboard):
    exported = exported_series()
    queried = set().union(*(queried_metrics(e) for e in expressions(dashboard)))
    assert queried, "no metric found in the dashboard's queries"
    assert queried <= exported, f"unknown metrics: {sorted(queried - exported)}"
    # And every instrument has a panel.
    bases = {re.sub(r"_(bucket|sum|count|total)$", "", n) for n in queried}
    assert bases == {re.sub(r"_(bucket|sum|count|total)$", "", n) for n in exported}


def test_panels_cover_rate_errors_duration_tools_tokens_and_sandbox(dashboard):
    titles = " | ".join(p["title"].lower() for p in dashboard["panels"])
    for word in ("request rate", "errors", "duration", "tool latency", "tool failure", "tokens", "sandbox wait"):
        assert word in titles, word


def test_the_dashboard_is_well_formed(dashboard):
    assert dashboard["uid"] and dashboard["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}"
            # Grafana substitutes its variables before Prometheus parses the query.
            expr = target["expr"].replace("$__rate_interval", "5m").replace("$service", "agentmesh\\\\.v1\\\\..*")
            promql_parser.parse(expr)  # raises on a syntax error
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"datasource", "service"}
