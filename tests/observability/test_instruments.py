"""The shared instruments and their helpers, and local metric points under $AGENTMESH_HOME/metrics/."""

from __future__ import annotations

import asyncio

import pytest

from agentmesh.config import Settings
from agentmesh.telemetry import setup_telemetry
from agentmesh.telemetry.instruments import (
    GEN_AI_OPERATION_DURATION,
    GEN_AI_TOKEN_USAGE,
    SANDBOX_WAIT,
    TOOL_DURATION,
    TURNS_IN_FLIGHT,
)
from agentmesh.telemetry.metricstore import metric_store_dir, read_metric_points
from tests.observability.obs_helpers import memory_telemetry, metric_points


def by_attributes(points, *keys):
    return {tuple(p.attributes.get(k) for k in keys): p for p in points}


def test_tool_timer_reports_outcomes():
    telemetry, _, reader = memory_telemetry("agent")
    metrics = telemetry.metrics
    with metrics.tool_timer("shell"):
        pass
    with metrics.tool_timer("shell") as timer:
        timer.outcome = "timeout"
    with pytest.raises(RuntimeError), metrics.tool_timer("read_file"):
        raise RuntimeError("boom")
    metrics.record_tool("read_file", 0.1, "something-odd")  # unknown outcomes count as errors

    points = by_attributes(metric_points(reader, TOOL_DURATION), "tool", "outcome")
    assert set(points) == {("shell", "ok"), ("shell", "timeout"), ("read_file", "error")}
    assert points[("read_file", "error")].count == 2


async def test_a_cancelled_tool_call_is_reported_as_cancelled():
    telemetry, _, reader = memory_telemetry("agent")

    async def slow():
        with telemetry.metrics.tool_timer("shell"):
            await asyncio.sleep(10)

    task = asyncio.create_task(slow())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert set(by_attributes(metric_points(reader, TOOL_DURATION), "outcome")) == {("cancelled",)}


def test_turns_in_flight_go_up_and_back_down():
    telemetry, _, reader = memory_telemetry("agent")
    with telemetry.metrics.turn_in_flight():
        with telemetry.metrics.turn_in_flight():
            assert metric_points(reader, TURNS_IN_FLIGHT)[0].value == 2
    with pytest.raises(ValueError), telemetry.metrics.turn_in_flight():
        raise ValueError
    assert metric_points(reader, TURNS_IN_FLIGHT)[0].value == 0


def test_model_calls_record_duration_and_tokens_by_type():
    telemetry, _, reader = memory_telemetry("agent")
    metrics = telemetry.metrics
    metrics.record_model_call(model="gpt-x", provider="openai", seconds=1.5, input_tokens=100, output_tokens=20)
    metrics.record_model_call(model="gpt-x", provider="openai", seconds=0.5, error_type="UNAVAILABLE")

    tokens = by_attributes(metric_points(reader, GEN_AI_TOKEN_USAGE), "gen_ai.request.model", "gen_ai.token.type")
    assert tokens[("gpt-x", "input")].sum == 100 and tokens[("gpt-x", "output")].sum == 20
    assert all(p.attributes["gen_ai.provider.name"] == "openai" for p in tokens.values())
    durations = by_attributes(metric_points(reader, GEN_AI_OPERATION_DURATION), "error.type")
    assert durations[(None,)].sum == 1.5 and durations[("UNAVAILABLE",)].count == 1


def test_sandbox_wait_is_recorded_per_executor():
    telemetry, _, reader = memory_telemetry("tools")
    telemetry.metrics.record_sandbox_wait(0.02, "local")
    telemetry.metrics.record_sandbox_wait(4.0, "kubernetes")
    points = by_attributes(metric_points(reader, SANDBOX_WAIT), "executor")
    assert points[("kubernetes",)].sum == 4.0 and points[("local",)].count == 1


def test_local_mode_leaves_metric_points_behind_at_shutdown(tmp_path):
    settings = Settings.from_env({"AGENTMESH_HOME": str(tmp_path), "AGENTMESH_TRACES": "local"})
    telemetry = setup_telemetry("tools", settings)
    telemetry.metrics.record_tool("shell", 0.5, "ok")
    telemetry.metrics.record_tool("shell", 1.5, "ok")
    telemetry.shutdown()

    (point,) = [p for p in read_metric_points(metric_store_dir(tmp_path)) if p["name"] == TOOL_DURATION]
    assert point["service"] == "agentmesh-tools" and point["unit"] == "s" and point["type"] == "histogram"
    assert point["attributes"] == {"tool": "shell", "outcome": "ok"}
    assert (point["count"], point["sum"]) == (2, 2.0)
    assert len(point["buckets"]) == len(point["bounds"]) + 1
