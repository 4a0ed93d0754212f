"""Test helpers for the observability suite: in-memory providers and a small traced gRPC service."""

from __future__ import annotations

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentmesh.telemetry import Telemetry


def memory_telemetry(service: str) -> tuple[Telemetry, InMemorySpanExporter, InMemoryMetricReader]:
    """A Telemetry whose spans and metrics stay in memory, for assertions."""
    resource = Resource.create({"service.name": f"agentmesh-{service}"})
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
    return Telemetry(service, tracer_provider, meter_provider), spans, reader


def metric_points(reader: InMemoryMetricReader, name: str) -> list:
    """Every data point of the metric `name` collected so far."""
    data = reader.get_metrics_data()
    points = []
    for resource_metrics in (data.resource_metrics if data else []):
        for scope in resource_metrics.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    points.extend(metric.data.data_points)
    return points


class CapturedLogs:
    """Every log line (structlog and stdlib) written while configured, as text and as JSON."""

    def __init__(self):
        import io

        self.stream = io.StringIO()

    @property
    def text(self) -> str:
        return self.stream.getvalue()

    def lines(self) -> list[dict]:
        import json

        return [json.loads(line) for line in self.text.splitlines() if line.strip()]


def capture_logs(service: str, secrets=(), level: str = "info"):
    """Configure agentmesh logging into memory; a context manager that restores defaults after."""
    import contextlib
    import logging

    import structlog

    from agentmesh.logs import configure_logging

    @contextlib.contextmanager
    def manager():
        captured = CapturedLogs()
        configure_logging(service, level, secrets=secrets, stream=captured.stream)
        try:
            yield captured
        finally:
            root = logging.getLogger()
            for handler in [h for h in root.handlers if getattr(h, "_agentmesh_json_handler", False)]:
                root.removeHandler(handler)
            root.setLevel(logging.WARNING)
            structlog.reset_defaults()
            structlog.contextvars.clear_contextvars()

    return manager()
