"""Local metrics: data points as JSON lines under `$AGENTMESH_HOME/metrics/`, one file per process.

A periodic reader exports every `OTEL_METRIC_EXPORT_INTERVAL` milliseconds and once more at
shutdown, so a stopped service always leaves its final cumulative values behind. Each line is
one data point: {"time", "service", "name", "unit", "type", "attributes", value | count/sum/buckets}.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, Iterable

from opentelemetry.sdk.metrics.export import (
    HistogramDataPoint,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
)

from agentmesh.telemetry.spanstore import read_jsonl_dir

__all__ = ["LocalMetricExporter", "metric_store_dir", "read_metric_points"]


def metric_store_dir(home: Path) -> Path:
    return Path(home) / "metrics"


def _points(metrics_data: MetricsData) -> Iterable[dict[str, Any]]:
    for resource_metrics in metrics_data.resource_metrics:
        service = resource_metrics.resource.attributes.get("service.name", "")
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                kind = type(metric.data).__name__.lower()  # histogram, sum, gauge
                for point in metric.data.data_points:
                    row = {
                        "time": point.time_unix_nano / 1e9,
                        "service": service,
                        "name": metric.name,
                        "unit": metric.unit or "",
                        "type": kind,
                        "attributes": dict[str, Any](point.attributes or {}),
                    }
                    if isinstance(point, HistogramDataPoint):
                        row.update(
                            count=point.count,
                            sum=point.sum,
                            bounds=list(point.explicit_bounds),
                            buckets=list(point.bucket_counts),
                        )
                    elif isinstance(point, NumberDataPoint):
                        row["value"] = point.value
                    yield row


class LocalMetricExporter(MetricExporter):
    def __init__(self, directory: Path, service: str):
        super().__init__(preferred_temporality={}, preferred_aggregation={})
        self._path = Path(directory) / f"{service}-{os.getpid()}.jsonl"
        self._lock = threading.Lock()

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        lines = "".join(json.dumps(row, separators=(",", ":"), default=str) + "\n" for row in _points(metrics_data))
        if not lines:
            return MetricExportResult.SUCCESS
        try:
            with self._lock:
                self._path.parent.mkdir(parents=True, exist_ok=True)
                with self._path.open("a", encoding="utf-8") as out:
                    out.write(lines)
        except OSError:
            return MetricExportResult.FAILURE
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        return None


def read_metric_points(directory: Path) -> Iterable[dict[str, Any]]:
    """Every stored data point in file order (later lines are later, cumulative values)."""
    return read_jsonl_dir(directory)

