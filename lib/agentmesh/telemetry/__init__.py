"""OpenTelemetry set-up for one service: tracer and meter providers passed down, never global.

Several services can share a process (tests, `agentmesh up` in one process), so every
service gets providers of its own carrying `service.name = agentmesh-<service>`, and
instrumentation is attached with those providers explicitly.

Modes (`AGENTMESH_TRACES`): `local` keeps spans under `$AGENTMESH_HOME/traces/` and metric
points under `$AGENTMESH_HOME/metrics/`; `otlp` exports both over OTLP/gRPC as the standard
`OTEL_EXPORTER_OTLP_*` variables say; `none` turns both off.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable
from urllib.parse import unquote

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import (
    AlwaysOffExemplarFilter,
    AlwaysOnExemplarFilter,
    ExemplarFilter,
    MeterProvider,
    TraceBasedExemplarFilter,
)
from opentelemetry.sdk.metrics.export import MetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider, sampling
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from agentmesh.config import OtlpExporterSettings, Settings, TelemetrySettings
from agentmesh.telemetry.instruments import ServiceMetrics
from agentmesh.telemetry.metricstore import LocalMetricExporter, metric_store_dir
from agentmesh.telemetry.propagation import traceparent_env
from agentmesh.telemetry.spanstore import LocalSpanExporter, prune_store, span_store_dir

__all__ = ["Telemetry", "setup_telemetry", "traceparent_env"]

# OTEL_METRICS_EXEMPLAR_FILTER, as the OpenTelemetry spec names its values.
_EXEMPLAR_FILTERS: dict[str, ExemplarFilter] = {
    "always_off": AlwaysOffExemplarFilter(),
    "always_on": AlwaysOnExemplarFilter(),
    "trace_based": TraceBasedExemplarFilter(),
}


@dataclass
class Telemetry:
    service: str
    tracer_provider: TracerProvider | trace.NoOpTracerProvider
    meter_provider: MeterProvider | metrics.NoOpMeterProvider
    _closers: list[Callable[[], object]] = field(default_factory=list, repr=False)

    @cached_property
    def tracer(self) -> trace.Tracer:
        # Made once: get_tracer goes through the SDK's deprecation wrapper (~15 µs a call).
        return self.tracer_provider.get_tracer(f"agentmesh.{self.service}")

    @property
    def meter(self) -> metrics.Meter:
        return self.meter_provider.get_meter(f"agentmesh.{self.service}")

    @cached_property
    def metrics(self) -> ServiceMetrics:
        """The shared instruments (RPC, GenAI, tools, turns, sandbox) on this service's meter."""
        return ServiceMetrics(self.meter)

    def instrument_httpx(self, client: Any) -> Any:
        """Trace an httpx Client/AsyncClient with this service's providers (and inject `traceparent`)."""
        from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

        HTTPXClientInstrumentor.instrument_client(
            client, tracer_provider=self.tracer_provider, meter_provider=self.meter_provider
        )
        return client

    def force_flush(self) -> None:
        for provider in (self.tracer_provider, self.meter_provider):
            flush = getattr(provider, "force_flush", None)
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
    config = settings.telemetry
    resource = Resource.create(
        {
            **_resource_attributes(config.resource_attributes),
            "service.name": f"agentmesh-{service}",
            "service.namespace": "agentmesh",
            # Distinguishes replicas: without it their cumulative series collide in Prometheus.
            "service.instance.id": f"{socket.gethostname()}-{os.getpid()}",
        }
    )
    tracer_provider = TracerProvider(resource=resource, sampler=_sampler(config))
    metric_exporter: MetricExporter
    if settings.traces == "otlp":
        span_exporter, metric_exporter = _otlp_exporters(config)
        tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
    else:
        retention_s = config.traces_retention_days * 86400
        for directory in (span_store_dir(settings.home), metric_store_dir(settings.home)):
            prune_store(directory, retention_s)
        max_bytes = config.traces_max_mb * 1024 * 1024
        exporter = LocalSpanExporter(span_store_dir(settings.home), service, max_bytes=max_bytes)
        # A short delay so `agentmesh trace show --last` sees a turn moments after it ends.
        tracer_provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=200))
        metric_exporter = LocalMetricExporter(metric_store_dir(settings.home), service)
    reader = PeriodicExportingMetricReader(metric_exporter, export_interval_millis=config.metric_export_interval_ms)
    meter_provider = MeterProvider(resource=resource, metric_readers=[reader],
                                   exemplar_filter=_EXEMPLAR_FILTERS[config.exemplar_filter])
    return Telemetry(service, tracer_provider, meter_provider)


def _resource_attributes(text: str) -> dict[str, str]:
    """OTEL_RESOURCE_ATTRIBUTES (k8s.pod.name=..., ...) as a dict."""
    attributes = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            attributes[key.strip()] = unquote(value.strip())
    return attributes


def _otlp_exporters(config: TelemetrySettings) -> tuple[SpanExporter, MetricExporter]:
    """OTLP span and metric exporters over gRPC (default) or HTTP/protobuf, per OTEL_EXPORTER_OTLP_*."""
    traces, metrics_ = config.otlp("traces"), config.otlp("metrics")
    if traces.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpans

        span_exporter: SpanExporter = GrpcSpans(**_otlp_options(traces))
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpans

        span_exporter = HttpSpans(**_otlp_options(traces, config.otlp_traces.endpoint, "v1/traces"))
    if metrics_.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetrics

        metric_exporter: MetricExporter = GrpcMetrics(**_otlp_options(metrics_))
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetrics

        metric_exporter = HttpMetrics(**_otlp_options(metrics_, config.otlp_metrics.endpoint, "v1/metrics"))
    return span_exporter, metric_exporter


def _otlp_options(otlp: OtlpExporterSettings, own_endpoint: str | None = None, path: str = "") -> dict[str, Any]:
    """Exporter arguments. Over HTTP (`path` given), the scheme of the URL decides security, and
    a general endpoint is a base URL under which each signal has its own path."""
    options: dict[str, Any] = {}
    if otlp.endpoint:
        options["endpoint"] = otlp.endpoint
        if path and not own_endpoint:
            options["endpoint"] = f"{otlp.endpoint.rstrip('/')}/{path}"
    if otlp.headers:
        options["headers"] = {
            unquote(k.strip()): unquote(v.strip())
            for k, sep, v in (item.partition("=") for item in otlp.headers.split(","))
            if sep and k.strip()
        }
    if otlp.insecure is not None and not path:
        options["insecure"] = otlp.insecure
    if otlp.timeout_ms is not None:
        options["timeout"] = otlp.timeout_ms / 1000  # the standard unit is ms; the exporters take seconds
    return options


def _sampler(config: TelemetrySettings) -> sampling.Sampler:
    """OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG; default: parent-based, always on."""
    ratio = min(config.sampler_arg, 1.0)
    choices = {
        "always_on": sampling.ALWAYS_ON,
        "always_off": sampling.ALWAYS_OFF,
        "traceidratio": sampling.TraceIdRatioBased(ratio),
        "parentbased_always_on": sampling.ParentBased(sampling.ALWAYS_ON),
        "parentbased_always_off": sampling.ParentBased(sampling.ALWAYS_OFF),
        "parentbased_traceidratio": sampling.ParentBased(sampling.TraceIdRatioBased(ratio)),
    }
    return choices[config.sampler]
