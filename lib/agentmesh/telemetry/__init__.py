"""OpenTelemetry set-up for one service: tracer and meter providers passed down, never global.

Several services can share a process (tests, `agentmesh up` in one process), so every
service gets providers of its own carrying `service.name = agentmesh-<service>`, and
instrumentation is attached with those providers explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from agentmesh.config import Settings
from agentmesh.telemetry.spanstore import LocalSpanExporter, span_store_dir


@dataclass
class Telemetry:
    service: str
    tracer_provider: TracerProvider | trace.NoOpTracerProvider
    meter_provider: MeterProvider | metrics.NoOpMeterProvider
    _closers: list = field(default_factory=list, repr=False)

    @property
    def tracer(self) -> trace.Tracer:
        return self.tracer_provider.get_tracer(f"agentmesh.{self.service}")

    @property
    def meter(self) -> metrics.Meter:
        return self.meter_provider.get_meter(f"agentmesh.{self.service}")

    def force_flush(self) -> None:
        flush = getattr(self.tracer_provider, "force_flush", None)
        if flush:
            flush()

    def shutdown(self) -> None:
        for close in (self.tracer_provider, self.meter_provider):
            stop = getattr(close, "shutdown", None)
            if stop:
                stop()


def setup_telemetry(service: str, settings: Settings) -> Telemetry:
    """Build the providers for `service` as `settings.traces` asks: local store, OTLP, or none."""
    if settings.traces == "none":
        return Telemetry(service, trace.NoOpTracerProvider(), metrics.NoOpMeterProvider())
    resource = Resource.create({"service.name": f"agentmesh-{service}", "service.namespace": "agentmesh"})
    tracer_provider = TracerProvider(resource=resource)
    metric_readers = []
    if settings.traces == "otlp":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        metric_readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    else:
        exporter = LocalSpanExporter(span_store_dir(settings.home), service)
        # A short delay so `agentmesh trace show --last` sees a turn moments after it ends.
        tracer_provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=200))
    meter_provider = MeterProvider(resource=resource, metric_readers=metric_readers)
    return Telemetry(service, tracer_provider, meter_provider)
