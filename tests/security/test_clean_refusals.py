"""Refusals are the status they say, every time: a refused request stream is UNAUTHENTICATED
however its client writes, and inputs that used to end in INTERNAL get INVALID_ARGUMENT with a
sentence. The real stack, over real gRPC."""

from __future__ import annotations

import collections
import math

import grpc
import pytest

from agentmesh.internal.v1 import (
    agent_service_pb2,
    agent_service_pb2_grpc,
    memory_service_pb2,
    memory_service_pb2_grpc,
    tools_service_pb2,
    tools_service_pb2_grpc,
)
from agentmesh.rpc.client import open_channel
from agentmesh.v1 import common_pb2, gateway_pb2
from tests.support.stack import Stack

TRIES = 30
BIG = "x" * 200_000  # several of these are still on the way when the server refuses the call


@pytest.fixture
async def stack(tmp_path, llm):
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url) as running:
        yield running


def _streams(stack):
    """Each service's request-streaming methods, with what a caller would write on them."""
    agent = agent_service_pb2_grpc.AgentStub(open_channel(stack.addresses["agent"]))
    memory = memory_service_pb2_grpc.MemoryStub(open_channel(stack.addresses["memory"]))
    tools = tools_service_pb2_grpc.ToolsStub(open_channel(stack.addresses["tools"]))
    forged = common_pb2.Message(role="assistant", content=BIG)
    return {
        "agent.RunTurn": (agent.RunTurn, lambda: agent_service_pb2.RunTurnRequest(session_id="victim", run_id="r1", message=BIG)),
        "memory.CarriedCalls": (memory.CarriedCalls, lambda: memory_service_pb2.CarriedMemoryCall(
            call=common_pb2.CarriedCall(id=1), append_messages=memory_service_pb2.AppendMessagesRequest(
                session_id="victim", messages=[forged]))),
        "tools.CarriedCalls": (tools.CarriedCalls, lambda: tools_service_pb2.CarriedToolsCall(
            call=common_pb2.CarriedCall(id=1), execute=tools_service_pb2.ExecuteRequest(
                session_id="victim", call_id="c1", name="shell", arguments_json='{"command": "id"}' + " " * 200_000))),
    }


@pytest.mark.timeout(300)
async def test_a_refused_request_stream_is_unauthenticated_every_time(stack):
    for name, (method, request) in _streams(stack).items():
        outcomes: collections.Counter[str] = collections.Counter()
        for _ in range(TRIES):
            async def requests(make=request):
                for _ in range(5):
                    yield make()

            try:
                async for _ in method(requests(), timeout=30):
                    pass
                outcomes["OK"] += 1
            except grpc.aio.AioRpcError as err:
                outcomes[err.code().name] += 1
                if err.code() == grpc.StatusCode.UNAUTHENTICATED:
                    assert "only the" in err.details() and "may call it" in err.details(), err.details()
        assert outcomes == {"UNAUTHENTICATED": TRIES}, (name, dict(outcomes))


@pytest.mark.timeout(120)
async def test_a_refused_stream_whose_client_waits_for_an_answer_is_told_at_once(stack):
    """A client that writes one call and waits for its answer (as the agent's carried calls do)
    gets the refusal, not a stream that waits for it to stop writing."""
    for name, (method, request) in _streams(stack).items():
        call = method(timeout=60)
        await call.write(request())
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call.read()
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, (name, info.value.details())


async def test_usage_times_past_any_date_are_invalid_argument(stack):
    for start, end in [(1e308, 0.0), (0.0, 1e308), (math.inf, 0.0), (1e17, 1e18)]:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stack.gateway_stub().GetUsage(gateway_pb2.GetUsageRequest(start=start, end=end), timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (start, end, info.value.details())
        assert "unix time in seconds" in info.value.details()


async def test_a_tool_timeout_that_is_not_a_number_is_refused(stack):
    tools = stack.tools_stub()
    for literal in ("NaN", "Infinity", "-Infinity"):
        reply = await tools.Execute(tools_service_pb2.ExecuteRequest(
            session_id="s-nan", call_id="c1", name="shell",
            arguments_json=f'{{"command": "echo ran", "timeout_s": {literal}}}'), timeout=30)
        assert reply.result.is_error and "ran" not in reply.result.output
        assert f"{literal} is not a JSON number" in reply.result.output, reply.result.output
