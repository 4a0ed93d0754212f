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
from typing import Any, Callable, Mapping
from urllib.parse import unquote

from opentelemetry import metrics, trace
from opentelemetry.propagate import inject
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider, sampling
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from agentmesh.config import ConfigError, Settings, env_float, env_int, env_str
from agentmesh.telemetry.instruments import ServiceMetrics
from agentmesh.telemetry.metricstore import LocalMetricExporter, metric_store_dir
from agentmesh.telemetry.spanstore import LocalSpanExporter, prune_store, span_store_dir

DEFAULT_METRIC_INTERVAL_MS = 60_000


@dataclass
class Telemetry:
    service: str
    tracer_provider: TracerProvider | trace.NoOpTracerProvider
    meter_provider: MeterProvider | metrics.NoOpMeterProvider
    _closers: list[Callable[[], object]] = field(default_factory=list, repr=False)

    @property
    def tracer(self) -> trace.Tracer:
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


def traceparent_env() -> dict[str, str]:
    """`TRACEPARENT` (and `TRACESTATE`) for the current span, for a sandboxed process or pod.

    Empty when no span is recording, so callers can always `env.update(traceparent_env())`.
    """
    carrier: dict[str, str] = {}
    inject(carrier)
    env = {}
    if carrier.get("traceparent"):
        env["TRACEPARENT"] = carrier["traceparent"]
        if carrier.get("tracestate"):
            env["TRACESTATE"] = carrier["tracestate"]
    return env


def setup_telemetry(service: str, settings: Settings) -> Telemetry:
    """Build the providers for `service` as `settings.traces` asks: local store, OTLP, or none."""
    if settings.traces == "none":
        return Telemetry(service, trace.NoOpTracerProvider(), metrics.NoOpMeterProvider())
    env = settings.environ
    resource = Resource.create(
        {
            **_resource_attributes(env),
            "service.name": f"agentmesh-{service}",
            "service.namespace": "agentmesh",
            # Distinguishes replicas: without it their cumulative series collide in Prometheus.
            "service.instance.id": f"{socket.gethostname()}-{os.getpid()}",
        }
    )
    tracer_provider = TracerProvider(resource=resource, sampler=_sampler(env))
    interval_ms = env_int(env, "OTEL_METRIC_EXPORT_INTERVAL", DEFAULT_METRIC_INTERVAL_MS, minimum=100)
    if settings.traces == "otlp":
        span_exporter, metric_exporter = _otlp_exporters(env)
        tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
    else:
        retention_s = env_float(env, "AGENTMESH_TRACES_RETENTION_DAYS", 7.0, minimum=0.01) * 86400
        for directory in (span_store_dir(settings.home), metric_store_dir(settings.home)):
            prune_store(directory, retention_s)
        max_bytes = env_int(env, "AGENTMESH_TRACES_MAX_MB", 64, minimum=1) * 1024 * 1024
        exporter = LocalSpanExporter(span_store_dir(settings.home), service, max_bytes=max_bytes)
        # A short delay so `agentmesh trace show --last` sees a turn moments after it ends.
        tracer_provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=200))
        metric_exporter = LocalMetricExporter(metric_store_dir(settings.home), service)
    reader = PeriodicExportingMetricReader(metric_exporter, export_interval_millis=interval_ms)
    meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
    return Telemetry(service, tracer_provider, meter_provider)


def _resource_attributes(env: Mapping[str, str]) -> dict[str, str]:
    """OTEL_RESOURCE_ATTRIBUTES from the settings' environment (k8s.pod.name=..., ...)."""
    attributes = {}
    for item in env_str(env, "OTEL_RESOURCE_ATTRIBUTES").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            attributes[key.strip()] = unquote(value.strip())
    return attributes


def _otlp_exporters(env: Mapping[str, str]) -> tuple[Any, Any]:
    """OTLP span and metric exporters over gRPC (default) or HTTP/protobuf, per OTEL_EXPORTER_OTLP_*."""
    exporters = []
    for signal, path in (("TRACES", "v1/traces"), ("METRICS", "v1/metrics")):
        protocol = _pick(env, signal, "PROTOCOL") or "grpc"
        options = _otlp_options(env, signal)
        if protocol == "grpc":
            if signal == "TRACES":
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Exporter
            else:
                from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as Exporter  # type: ignore[assignment]  # one name, four classes
        elif protocol == "http/protobuf":
            options.pop("insecure", None)  # the scheme of the URL decides
            if not env_str(env, f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT") and "endpoint" in options:
                # The general endpoint is a base URL; each signal has its own path under it.
                options["endpoint"] = f"{options['endpoint'].rstrip('/')}/{path}"
            if signal == "TRACES":
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Exporter  # type: ignore[assignment]  # one name, four classes
            else:
                from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as Exporter  # type: ignore[assignment]  # one name, four classes
        else:
            raise ConfigError(
                f"OTEL_EXPORTER_OTLP_PROTOCOL must be grpc or http/protobuf, got {protocol!r}"
            )
        exporters.append(Exporter(**options))
    return exporters[0], exporters[1]


def _pick(env: Mapping[str, str], signal: str, suffix: str) -> str:
    return env_str(env, f"OTEL_EXPORTER_OTLP_{signal}_{suffix}") or env_str(env, f"OTEL_EXPORTER_OTLP_{suffix}")


def _otlp_options(env: Mapping[str, str], signal: str) -> dict[str, Any]:
    """Exporter arguments from OTEL_EXPORTER_OTLP_{signal}_* or OTEL_EXPORTER_OTLP_*, when set.

    Read from the settings' mapping rather than os.environ so the configuration stays one object.
    """
    options: dict[str, Any] = {}
    if endpoint := _pick(env, signal, "ENDPOINT"):
        options["endpoint"] = endpoint
    if headers := _pick(env, signal, "HEADERS"):
        options["headers"] = {
            unquote(k.strip()): unquote(v.strip())
            for k, sep, v in (item.partition("=") for item in headers.split(","))
            if sep and k.strip()
        }
    if insecure := _pick(env, signal, "INSECURE"):
        options["insecure"] = insecure.lower() in ("1", "true", "yes", "on")
    if timeout := _pick(env, signal, "TIMEOUT"):
        try:
            # The standard unit is milliseconds; the exporters take seconds.
            options["timeout"] = float(timeout) / 1000
        except ValueError:
            raise ConfigError(f"OTEL_EXPORTER_OTLP_TIMEOUT must be milliseconds, got {timeout!r}") from None
    return options


def _sampler(env: Mapping[str, str]) -> sampling.Sampler:
    """OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG; default: parent-based, always on."""
    name = env_str(env, "OTEL_TRACES_SAMPLER", "parentbased_always_on").lower()
    ratio = env_float(env, "OTEL_TRACES_SAMPLER_ARG", 1.0, minimum=0.0)
    ratio = min(ratio, 1.0)
    choices = {
        "always_on": sampling.ALWAYS_ON,
        "always_off": sampling.ALWAYS_OFF,
        "traceidratio": sampling.TraceIdRatioBased(ratio),
        "parentbased_always_on": sampling.ParentBased(sampling.ALWAYS_ON),
        "parentbased_always_off": sampling.ParentBased(sampling.ALWAYS_OFF),
        "parentbased_traceidratio": sampling.ParentBased(sampling.TraceIdRatioBased(ratio)),
    }
    if name not in choices:
        raise ConfigError(f"OTEL_TRACES_SAMPLER must be one of {', '.join(choices)}; got {name!r}")
    return choices[name]
