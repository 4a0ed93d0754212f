"""Metric instruments every service shares, so dashboards can rely on one set of names.

The names follow the OpenTelemetry semantic conventions where one exists (RPC, GenAI) and
live under `agentmesh.` otherwise. docs/observability.md lists each one with its attributes
and the name it takes in Prometheus; the Grafana dashboard in the Helm chart queries those.

    metrics = telemetry.metrics          # one `ServiceMetrics` per service, built lazily
    with metrics.turn_in_flight():
        ...
    with metrics.tool_timer("shell") as timer:
        result = await run()
        if result.timed_out:
            timer.outcome = "timeout"
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator, Mapping

from opentelemetry import metrics

from agentmesh.telemetry.genai import (
    ERROR_TYPE,
    GEN_AI_OPERATION_NAME,
    GEN_AI_PROVIDER_NAME,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_RESPONSE_MODEL,
    GEN_AI_TOKEN_TYPE,
)

__all__ = [
    "GEN_AI_OPERATION_DURATION",
    "GEN_AI_TOKEN_USAGE",
    "MEMORY_SEARCH_DURATION",
    "MODEL_SLOT_WAIT",
    "MODEL_SLOT_WAITING",
    "RETENTION_REMOVED",
    "RPC_SERVER_DURATION",
    "SANDBOX_WAIT",
    "TOOL_DURATION",
    "TOOL_OUTCOMES",
    "TURNS_IN_FLIGHT",
    "ServiceMetrics",
    "ToolTimer",
]

# --- instrument names (the contract with the dashboards) -----------------------------------
RPC_SERVER_DURATION = "rpc.server.duration"  # ms, histogram, per gRPC method
GEN_AI_TOKEN_USAGE = "gen_ai.client.token.usage"  # {token}, histogram, per model call and token type
GEN_AI_OPERATION_DURATION = "gen_ai.client.operation.duration"  # s, histogram, per model call
TOOL_DURATION = "agentmesh.tool.duration"  # s, histogram, per tool call {tool, outcome}
TURNS_IN_FLIGHT = "agentmesh.turns.in_flight"  # {turn}, up-down counter
SANDBOX_WAIT = "agentmesh.sandbox.wait"  # s, histogram: asked for a sandbox -> process/pod running
MEMORY_SEARCH_DURATION = "agentmesh.memory.search.duration"  # s, histogram
RETENTION_REMOVED = "agentmesh.retention.removed"
# A model's concurrency limit (its max_concurrency): calls waiting for one of its slots right
# now, and how long each call waited for one (0 for most) — a queue inside the agent, made visible.
MODEL_SLOT_WAITING = "agentmesh.model.slot.waiting"  # {call}, up-down counter {model}
MODEL_SLOT_WAIT = "agentmesh.model.slot.wait"  # s, histogram {model}

# Outcomes a tool call ends with; anything else is reported as "error".
TOOL_OUTCOMES = ("ok", "error", "timeout", "denied", "cancelled")

# Bucket boundaries. Milliseconds for RPCs (the SDK default suits them); the GenAI semantic
# conventions recommend these for seconds and tokens; tool and sandbox times span
# milliseconds (a jail) to minutes (a pod waiting for a node).
_SECONDS_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
_LONG_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)
_RPC_MS_BUCKETS = (0, 5, 10, 25, 50, 75, 100, 250, 500, 750, 1000, 2500, 5000, 7500, 10000, 30000, 60000, 300000)


class ToolTimer:
    """Measures one tool call; set `outcome` before the block ends to report something else than ok."""

    def __init__(self) -> None:
        self.outcome = "ok"
        self.seconds = 0.0


class ServiceMetrics:
    """The shared instruments on one service's meter, with helpers that fix their attributes."""

    def __init__(self, meter: metrics.Meter):
        self.rpc_server_duration = meter.create_histogram(
            RPC_SERVER_DURATION, unit="ms", description="Duration of inbound gRPC calls",
            explicit_bucket_boundaries_advisory=_RPC_MS_BUCKETS,
        )
        self.token_usage = meter.create_histogram(
            GEN_AI_TOKEN_USAGE, unit="{token}", description="Tokens used per model call, by token type",
            explicit_bucket_boundaries_advisory=_TOKEN_BUCKETS,
        )
        self.operation_duration = meter.create_histogram(
            GEN_AI_OPERATION_DURATION, unit="s", description="Duration of model calls",
            explicit_bucket_boundaries_advisory=_SECONDS_BUCKETS,
        )
        self.tool_duration = meter.create_histogram(
            TOOL_DURATION, unit="s", description="Duration of tool calls, by tool and outcome",
            explicit_bucket_boundaries_advisory=_LONG_SECONDS_BUCKETS,
        )
        self.turns_in_flight = meter.create_up_down_counter(
            TURNS_IN_FLIGHT, unit="{turn}", description="Agent turns running right now"
        )
        self.sandbox_wait = meter.create_histogram(
            SANDBOX_WAIT, unit="s", description="Time from asking for a sandbox until its process or pod runs",
            explicit_bucket_boundaries_advisory=_LONG_SECONDS_BUCKETS,
        )
        self.model_slot_waiting = meter.create_up_down_counter(
            MODEL_SLOT_WAITING, unit="{call}", description="Model calls waiting for a slot of their model's concurrency limit"
        )
        self.model_slot_wait = meter.create_histogram(
            MODEL_SLOT_WAIT, unit="s", description="Time a model call waited for a slot of its model's concurrency limit",
            explicit_bucket_boundaries_advisory=_LONG_SECONDS_BUCKETS,
        )
        self.memory_search_duration = meter.create_histogram(
            MEMORY_SEARCH_DURATION, unit="s", description="Duration of memory searches",
            explicit_bucket_boundaries_advisory=_SECONDS_BUCKETS,
        )
        self.retention_removed = meter.create_counter(
            RETENTION_REMOVED, unit="{record}", description="Records removed by retention sweeps and erasures, by kind"
        )

    # --- model calls ----------------------------------------------------------------------

    def record_model_call(
        self,
        *,
        model: str,
        provider: str,
        seconds: float,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        response_model: str = "",
        error_type: str = "",
        operation: str = "chat",
    ) -> None:
        """One model call: its duration, and its token usage when the provider reported it."""
        attributes = {
            GEN_AI_OPERATION_NAME: operation,
            GEN_AI_PROVIDER_NAME: provider,
            GEN_AI_REQUEST_MODEL: model,
        }
        if response_model:
            attributes[GEN_AI_RESPONSE_MODEL] = response_model
        duration_attributes = dict(attributes)
        if error_type:
            duration_attributes[ERROR_TYPE] = error_type
        self.operation_duration.record(max(seconds, 0.0), duration_attributes)
        for token_type, count in (("input", input_tokens), ("output", output_tokens)):
            if count is not None:
                self.token_usage.record(max(int(count), 0), {**attributes, GEN_AI_TOKEN_TYPE: token_type})

    # --- tools ----------------------------------------------------------------------------

    def record_tool(self, tool: str, seconds: float, outcome: str = "ok") -> None:
        outcome = outcome if outcome in TOOL_OUTCOMES else "error"
        self.tool_duration.record(max(seconds, 0.0), {"tool": tool, "outcome": outcome})

    @contextmanager
    def tool_timer(self, tool: str) -> Iterator[ToolTimer]:
        """Time a tool call; an exception escaping the block reports outcome "error" (or "cancelled")."""
        timer = ToolTimer()
        started = time.perf_counter()
        try:
            yield timer
        except BaseException as exc:
            if timer.outcome == "ok":
                timer.outcome = "cancelled" if _is_cancellation(exc) else "error"
            raise
        finally:
            timer.seconds = time.perf_counter() - started
            self.record_tool(tool, timer.seconds, timer.outcome)

    # --- turns, sandboxes, memory ---------------------------------------------------------

    @contextmanager
    def turn_in_flight(self, attributes: Mapping[str, str] | None = None) -> Iterator[None]:
        attributes = dict(attributes or {})
        self.turns_in_flight.add(1, attributes)
        try:
            yield
        finally:
            self.turns_in_flight.add(-1, attributes)

    def record_sandbox_wait(self, seconds: float, executor: str) -> None:
        """`executor` is "local" (bubblewrap) or "kubernetes" (a Job pod)."""
        self.sandbox_wait.record(max(seconds, 0.0), {"executor": executor})

    def model_slot_waiting_add(self, model: str, delta: int) -> None:
        """`model` is the catalogue's name ("default": the AGENTMESH_LLM_* model)."""
        self.model_slot_waiting.add(delta, {"model": model})

    def record_model_slot_wait(self, model: str, seconds: float) -> None:
        self.model_slot_wait.record(max(seconds, 0.0), {"model": model})

    def record_memory_search(self, seconds: float, kind: str = "hybrid") -> None:
        self.memory_search_duration.record(max(seconds, 0.0), {"kind": kind})

    def record_retention_removed(self, kind: str, count: int, reason: str = "retention") -> None:
        """`kind`: sessions | workspaces | memories | usage; `reason`: retention | erasure."""
        if count:
            self.retention_removed.add(count, {"kind": kind, "reason": reason})


def _is_cancellation(exc: BaseException) -> bool:
    import asyncio

    return isinstance(exc, (asyncio.CancelledError, GeneratorExit))
