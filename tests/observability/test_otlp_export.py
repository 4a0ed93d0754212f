"""OTLP mode: spans and metrics reach a collector, configured only from the standard OTEL_* variables."""

from __future__ import annotations

import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from agentmesh.config import ConfigError, Settings
from agentmesh.telemetry import setup_telemetry


class Collector(trace_service_pb2_grpc.TraceServiceServicer, metrics_service_pb2_grpc.MetricsServiceServicer):
    """Just enough of an OpenTelemetry collector: keeps what it is sent, and the headers."""

    def __init__(self):
        self.traces: list = []
        self.metrics: list = []
        self.headers: list[dict] = []

    def Export(self, request, context):
        self.headers.append(dict(context.invocation_metadata()))
        if isinstance(request, trace_service_pb2.ExportTraceServiceRequest):
            self.traces.append(request)
            return trace_service_pb2.ExportTraceServiceResponse()
        self.metrics.append(request)
        return metrics_service_pb2.ExportMetricsServiceResponse()


@pytest.fixture
def grpc_collector():
    collector = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(collector, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield collector, f"http://127.0.0.1:{port}"
    server.stop(0)


def span_names(requests) -> set[str]:
    return {
        span.name
        for request in requests
        for resource_spans in request.resource_spans
        for scope in resource_spans.scope_spans
        for span in scope.spans
    }


def metric_names(requests) -> set[str]:
    return {
        metric.name
        for request in requests
        for resource_metrics in request.resource_metrics
        for scope in resource_metrics.scope_metrics
        for metric in scope.metrics
    }


def resource_of(request) -> dict[str, str]:
    resource = request.resource_spans[0].resource
    return {a.key: a.value.string_value for a in resource.attributes}


def emit(telemetry) -> None:
    with telemetry.tracer.start_as_current_span("invoke_agent"):
        telemetry.metrics.record_tool("shell", 0.25, "ok")
        telemetry.metrics.record_model_call(model="m", provider="openai", seconds=1.0, input_tokens=10, output_tokens=2)
    telemetry.shutdown()  # flushes spans and takes a last metric reading


def test_grpc_export_of_spans_and_metrics(tmp_path, grpc_collector):
    collector, endpoint = grpc_collector
    settings = Settings.from_env({
        "AGENTMESH_HOME": str(tmp_path),
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,  # alone, it selects OTLP mode
        "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=team-a",
        "OTEL_RESOURCE_ATTRIBUTES": "k8s.pod.name=agent-7f9c,deployment.environment=test",
    })
    assert settings.traces == "otlp"
    emit(setup_telemetry("agent", settings))

    assert span_names(collector.traces) == {"invoke_agent"}
    assert {"agentmesh.tool.duration", "gen_ai.client.operation.duration", "gen_ai.client.token.usage"} <= metric_names(
        collector.metrics
    )
    resource = resource_of(collector.traces[0])
    assert resource["service.name"] == "agentmesh-agent"
    assert resource["service.namespace"] == "agentmesh"
    assert resource["k8s.pod.name"] == "agent-7f9c"
    assert resource["service.instance.id"]
    assert all(h.get("x-tenant") == "team-a" for h in collector.headers)
    # Nothing was written locally in OTLP mode.
    assert not (tmp_path / "traces").exists()


def test_http_protobuf_export(tmp_path):
    received: list[tuple[str, bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            received.append((self.path, self.rfile.read(int(self.headers["content-length"]))))
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        settings = Settings.from_env({
            "AGENTMESH_HOME": str(tmp_path),
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        })
        emit(setup_telemetry("tools", settings))
    finally:
        server.shutdown()
        server.server_close()
    paths = {path for path, _ in received}
    assert paths == {"/v1/traces", "/v1/metrics"}
    traces = [trace_service_pb2.ExportTraceServiceRequest.FromString(body) for path, body in received if path == "/v1/traces"]
    assert span_names(traces) == {"invoke_agent"}


def test_an_unknown_protocol_is_a_clear_configuration_error(tmp_path):
    # Refused when the settings are built at start-up, before any service runs.
    with pytest.raises(ConfigError, match="OTEL_EXPORTER_OTLP_PROTOCOL must be one of grpc, http/protobuf"):
        Settings.from_env({
            "AGENTMESH_HOME": str(tmp_path),
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon",
        })


def test_the_sampler_comes_from_the_environment(tmp_path):
    base = {"AGENTMESH_HOME": str(tmp_path), "AGENTMESH_TRACES": "local"}
    off = setup_telemetry("agent", Settings.from_env({**base, "OTEL_TRACES_SAMPLER": "always_off"}))
    with off.tracer.start_as_current_span("dropped") as span:
        assert not span.is_recording()
    off.shutdown()
    with pytest.raises(ConfigError, match="OTEL_TRACES_SAMPLER must be one of"):
        Settings.from_env({**base, "OTEL_TRACES_SAMPLER": "sometimes"})


def exemplar_count(requests) -> int:
    return sum(
        len(point.exemplars)
        for request in requests
        for resource_metrics in request.resource_metrics
        for scope in resource_metrics.scope_metrics
        for metric in scope.metrics
        for point in metric.histogram.data_points
    )


@pytest.mark.parametrize(("exemplar_filter", "expect_exemplars"), [(None, False), ("trace_based", True)])
def test_exemplars_are_off_unless_asked_for(tmp_path, grpc_collector, exemplar_filter, expect_exemplars):
    # A measurement made inside a sampled span carries that span as an exemplar only when
    # OTEL_METRICS_EXEMPLAR_FILTER asks for it: by default every call would pay for one.
    collector, endpoint = grpc_collector
    env = {"AGENTMESH_HOME": str(tmp_path), "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}
    if exemplar_filter:
        env["OTEL_METRICS_EXEMPLAR_FILTER"] = exemplar_filter
    emit(setup_telemetry("agent", Settings.from_env(env)))
    assert metric_names(collector.metrics)
    assert (exemplar_count(collector.metrics) > 0) is expect_exemplars
