"""The agent's Execute calls carried on one stream to the tools service (Tools.CarriedCalls,
agentmesh.rpc.carried): each still a call — checked as Execute, its deadline reaching the tools
service, its cancellation killing the sandboxed process as a cancelled unary call does."""

from __future__ import annotations

import asyncio
import json
import uuid

import grpc
import pytest

from agentmesh.agent.adapters.tools import GrpcToolRunner
from agentmesh.agent.types import ToolCall
from agentmesh.clients.tools import ToolsClient
from agentmesh.config import Settings
from agentmesh.internal.v1 import tools_service_pb2, tools_service_pb2_grpc
from agentmesh.rpc.identity import ServiceIdentity
from agentmesh.v1 import common_pb2
from tests.support.recording import recording_channel
from tests.tools.support import describe, processes_with, wait_until


def _keys(tools):
    return Settings.from_env(tools.env).keys_dir


def _runner(tools, caller: str = "agent", timeout_s: float = 30.0):
    channel, made = recording_channel(_keys(tools), caller, "tools", tools.host.target)
    client = ToolsClient(channel, tools.host.target, carry=(ServiceIdentity.open(caller, _keys(tools)), None))
    runner = GrpcToolRunner(client, timeout_s=timeout_s)
    return runner, channel, made


def _shell(command: str, call_id: str = "c1") -> ToolCall:
    return ToolCall(call_id, "shell", json.dumps({"command": command}))


def _marker() -> str:
    return f"{uuid.uuid4().int % 10**6 + 1000}.5"


async def test_tool_calls_ride_one_stream(tools):
    runner, channel, made = _runner(tools)
    try:
        first = await runner.execute("s1", _shell("echo one"))
        second = await runner.execute("s1", _shell("echo two", "c2"))
        assert (first.output.strip(), second.output.strip()) == ("one", "two")
        assert (first.call_id, second.call_id) == ("c1", "c2")
        assert made == ["/agentmesh.internal.v1.Tools/CarriedCalls"] and runner.carrying_executes
    finally:
        await runner.close()
        await channel.close()


async def test_cancelling_a_carried_tool_call_kills_its_process_tree(tools):
    runner, channel, _ = _runner(tools)
    marker = _marker()
    try:
        call = asyncio.create_task(runner.execute("s1", _shell(f"sleep {marker} & sleep {marker}; wait")))
        assert await wait_until(lambda: len(processes_with(f"sleep {marker}")) >= 2), "the command never started"
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert await wait_until(lambda: not processes_with(marker)), f"left running:\n{describe(processes_with(marker))}"
        # The stream serves the next call.
        assert (await runner.execute("s1", _shell("echo after"))).output.strip() == "after"
    finally:
        await runner.close()
        await channel.close()


async def test_the_callers_deadline_reaches_the_tools_service(tools):
    channel, _ = recording_channel(_keys(tools), "agent", "tools", tools.host.target)
    token = ServiceIdentity.open("agent", _keys(tools)).token("tools")
    marker = _marker()
    stream = tools_service_pb2_grpc.ToolsStub(channel).CarriedCalls()
    try:
        # The caller never cancels: the deadline it sent is what stops the call at the server.
        await stream.write(tools_service_pb2.CarriedToolsCall(
            call=common_pb2.CarriedCall(id=1, service_token=token, timeout_s=1.0),
            execute=tools_service_pb2.ExecuteRequest(session_id="s1", call_id="c1", name="shell",
                                             arguments_json=json.dumps({"command": f"sleep {marker}"}))))
        answer = await asyncio.wait_for(stream.read(), 10)
        assert (answer.status.id, answer.status.code) == (1, grpc.StatusCode.DEADLINE_EXCEEDED.value[0])
        assert await wait_until(lambda: not processes_with(marker)), f"left running:\n{describe(processes_with(marker))}"
    finally:
        stream.cancel()
        await channel.close()


async def test_a_stream_that_ends_stops_its_calls(tools):
    runner, channel, _ = _runner(tools)
    marker = _marker()
    try:
        call = asyncio.create_task(runner.execute("s1", _shell(f"sleep {marker}")))
        assert await wait_until(lambda: bool(processes_with(f"sleep {marker}"))), "the command never started"
        await runner.close()  # the agent going away: its stream ends
        outcome = await asyncio.wait_for(call, 10)
        assert outcome.is_error and outcome.error_kind == "sandbox_unavailable"
        assert await wait_until(lambda: not processes_with(marker)), f"left running:\n{describe(processes_with(marker))}"
    finally:
        await runner.close()
        await channel.close()


async def test_each_carried_tool_call_is_checked_as_an_execute(tools):
    runner, channel, made = _runner(tools, caller="memory")
    try:
        outcome = await runner.execute("s1", _shell("echo forged > forged.txt"))
        assert outcome.is_error and outcome.error_kind == "denied", outcome
        assert made == ["/agentmesh.internal.v1.Tools/CarriedCalls"]
        assert not (tools.workspace("s1") / "forged.txt").exists()
    finally:
        await runner.close()
        await channel.close()


async def test_an_answer_too_large_for_the_stream_fails_its_call_alone(home):
    from tests.tools.support import ToolsClient

    # An output cap above what a message to the agent may hold (16 MiB).
    async with ToolsClient(home, {"AGENTMESH_TOOLS_OUTPUT_CAP_BYTES": str(17 * 1024 * 1024)}) as tools:
        runner, channel, made = _runner(tools)
        try:
            huge = await runner.execute("s1", _shell("yes | head -c 17000000"))
            assert huge.is_error and huge.error_kind == "resource_exhausted", (huge.error_kind, huge.output[:200])
            # The stream was not ended by it: the next call rides it (no second stream, no unary call).
            assert (await runner.execute("s1", _shell("echo next", "c2"))).output.strip() == "next"
            assert made == ["/agentmesh.internal.v1.Tools/CarriedCalls"]
        finally:
            await runner.close()
            await channel.close()
