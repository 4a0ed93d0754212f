"""SIGTERM drains: the services run as `agentmesh serve` processes, exactly as `agentmesh up` runs them."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from agentmesh.cli.stack import LocalStack
from agentmesh.rpc.client import open_channel
from agentmesh.v1 import gateway_pb2, gateway_pb2_grpc
from tests.e2e.conftest import collect, of_kind
from tests.support.llm_server import ScriptedLLMServer, reply
from tests.support.local_stack import on_free_ports, start_healthy
from tests.support.stack import stack_env


def answer_by_message(request):
    text = request.body["messages"][-1]["content"]
    return reply("quick done", delay_s=1.5) if text == "quick" else reply("too late", delay_s=8)


@pytest.mark.slow
async def test_sigterm_lets_short_turns_finish_and_tells_long_ones_why_they_end(tmp_path):
    with ScriptedLLMServer(default=answer_by_message) as llm:
        env = on_free_ports({**os.environ, **stack_env(tmp_path / "home", llm.base_url, {"AGENTMESH_DRAIN_S": "3"})})
        stack = LocalStack(env, log_dir=tmp_path / "logs")
        try:
            await start_healthy(stack)
            async with open_channel(stack.settings.address_of("gateway")) as channel:
                gateway = gateway_pb2_grpc.GatewayStub(channel)
                quick = asyncio.create_task(
                    collect(gateway.Chat(gateway_pb2.ChatRequest(session_id="a", message="quick"), timeout=30))
                )
                slow = asyncio.create_task(
                    collect(gateway.Chat(gateway_pb2.ChatRequest(session_id="b", message="slow"), timeout=30))
                )
                await asyncio.to_thread(llm.wait_for_requests, 2, 20)

                stack.children["gateway"].send_signal(signal.SIGTERM)

                quick_events = await quick
                assert of_kind(quick_events, "run_finished")[0].final_text == "quick done"
                slow_events = await slow
                error = of_kind(slow_events, "error")[0]
                assert error.code == "UNAVAILABLE"
                assert "shutting down" in error.message and "saved" in error.message

            code = await asyncio.to_thread(stack.children["gateway"].wait, 15)
            assert code == 0
        finally:
            await asyncio.to_thread(stack.stop)
