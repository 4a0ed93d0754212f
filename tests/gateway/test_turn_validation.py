"""One definition of a valid turn request (agentmesh.turn_input): the gateway refuses a bad one
before anything happens, and the agent, checking again as defence in depth, refuses it with the
same sentence and the same field — over real gRPC, each service as its callers reach it."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from agentmesh.errors import InvalidArgument
from agentmesh.internal.v1 import agent_service_pb2, agent_service_pb2_grpc
from agentmesh.turn_input import TurnLimits, validate_turn
from agentmesh.v1 import gateway_pb2
from tests.support.stack import Stack
from tests.support.turns import collect

BAD_OPTIONS = [
    ("", {}, "message"),
    ("hi", {"max_iterations": -1}, "options.max_iterations"),
    ("hi", {"approval_tools": ["x"] * 65}, "options.approval_tools"),
    ("hi", {"approval_tools": [" "]}, "options.approval_tools"),
    ("hi", {"token_budget": -5}, "options.token_budget"),
    ("hi", {"session_token_budget": -5}, "options.session_token_budget"),
    ("hi", {"mode": "turbo"}, "options.mode"),
    ("hi", {"if_busy": "shove"}, "options.if_busy"),
    ("hi", {"permission_mode": "yolo"}, "options.permission_mode"),
    ("hi", {"model": "m" * 201}, "options.model"),
]


@pytest.fixture
async def stack(tmp_path, llm):
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url) as running:
        yield running


def field_of(err: grpc.aio.AioRpcError) -> str:
    for detail in rpc_status.from_call(err).details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return info.metadata.get("field", "")
    return ""


async def refused(call) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await collect(call)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    return info.value


async def test_the_gateway_and_the_agent_refuse_a_bad_turn_alike(stack, llm):
    gateway = stack.gateway_stub()
    agent = agent_service_pb2_grpc.AgentStub(stack.channel("agent"))  # signed as the gateway, its one caller
    for message, options, field in BAD_OPTIONS:
        chat_options = gateway_pb2.ChatOptions(**options)
        at_gateway = await refused(gateway.Chat(
            gateway_pb2.ChatRequest(session_id="s1", message=message, options=chat_options), timeout=10))

        async def requests(message=message, chat_options=chat_options):
            yield agent_service_pb2.RunTurnRequest(session_id="s1", run_id="run-1", message=message, options=chat_options)

        at_agent = await refused(agent.RunTurn(requests(), timeout=10))
        assert at_gateway.details() == at_agent.details(), options
        assert field_of(at_gateway) == field_of(at_agent) == field, options
    assert llm.requests == []  # neither ran anything


def test_the_bounds_are_the_caller_s():
    options = gateway_pb2.ChatOptions(max_iterations=150, system_prompt="x" * 50)
    validate_turn("s1", "hi", options, TurnLimits(max_message_chars=100, max_iterations_cap=200))
    with pytest.raises(InvalidArgument) as refused_:
        validate_turn("s1", "hi", options, TurnLimits(max_message_chars=100, max_iterations_cap=100))
    assert refused_.value.metadata == {"field": "options.max_iterations"}
    with pytest.raises(InvalidArgument) as refused_:
        validate_turn("s1", "hi", options, TurnLimits(max_message_chars=40, max_iterations_cap=200))
    assert refused_.value.message == "options.system_prompt is 50 characters; the limit is 40"
