"""The agent service over real gRPC, with the real memory and tools services beside it."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from agentmesh.clients.tools import ToolsClient
from agentmesh.internal.v1 import agent_service_pb2, agent_service_pb2_grpc, memory_service_pb2
from agentmesh.v1 import gateway_pb2, sessions_pb2
from tests.support.llm_server import reply, tool_call
from tests.support.processes import processes_running
from tests.support.stack import Stack

SERVICES = ("memory", "tools", "agent")


@pytest.fixture
async def stack(tmp_path, llm):
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, services=SERVICES) as running:
        yield running


def agent_stub(stack: Stack) -> agent_service_pb2_grpc.AgentStub:
    return agent_service_pb2_grpc.AgentStub(stack.channel("agent"))


async def open_session(stack: Stack, session_id: str) -> None:
    session = sessions_pb2.Session(session_id=session_id, namespace="default")
    await stack.memory_stub().PutSession(memory_service_pb2.PutSessionRequest(session=session), timeout=10)


async def stored(stack: Stack, session_id: str) -> list:
    reply_ = await stack.memory_stub().ListMessages(sessions_pb2.GetTranscriptRequest(session_id=session_id), timeout=10)
    return list(reply_.messages)


async def until(predicate, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


async def test_run_turn_streams_events_and_persists_the_transcript(stack, llm):
    await open_session(stack, "wire")
    llm.add(reply("Writing.", tool_call("write_file", {"path": "a.txt", "content": "hello"}, id="w")), reply("Wrote it."))
    request = agent_service_pb2.RunTurnRequest(session_id="wire", run_id="run-1", message="write hello to a.txt")
    events = [e async for e in agent_stub(stack).RunTurn(iter([request]), timeout=30)]

    kinds = [e.WhichOneof("payload") for e in events]
    assert kinds[0] == "run_started" and kinds[-1] == "run_finished"
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert all(e.session_id == "wire" and e.run_id == "run-1" for e in events)
    result = next(e.tool_result.result for e in events if e.WhichOneof("payload") == "tool_result")
    assert result.call_id == "w" and not result.is_error
    finished = events[-1].run_finished
    assert finished.final_text == "Wrote it." and finished.trace_id == events[0].run_started.trace_id
    assert (stack.settings.home / "workspaces" / "wire" / "a.txt").read_text() == "hello"
    assert [(m.role, m.tool_call_id) for m in await stored(stack, "wire")] == [
        ("user", ""), ("assistant", ""), ("tool", "w"), ("assistant", "")]


async def test_bad_requests_are_refused_before_anything_runs(stack, llm):
    stub = agent_stub(stack)
    cases = [
        (agent_service_pb2.RunTurnRequest(session_id="", message="hi"), "session_id is required"),
        (agent_service_pb2.RunTurnRequest(session_id="../x", message="hi"), "malformed"),
        (agent_service_pb2.RunTurnRequest(session_id="ok", message="  "), "message is empty"),
        (agent_service_pb2.RunTurnRequest(session_id="ok", message="hi", namespace="a b"), "namespace"),
        (agent_service_pb2.RunTurnRequest(session_id="ok", message="hi",
                                  options=gateway_pb2.ChatOptions(max_iterations=1000)), "max_iterations"),
    ]
    for request, words in cases:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            [e async for e in stub.RunTurn(iter([request]), timeout=10)]
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and words in info.value.details()
    assert llm.requests == []


async def test_cancelling_run_turn_kills_the_sandboxed_tool_and_closes_the_step(stack, llm):
    await open_session(stack, "cancel")
    llm.add(reply("", tool_call("shell", {"command": "sleep 48.25"}, id="slow")))
    call = agent_stub(stack).RunTurn(iter([agent_service_pb2.RunTurnRequest(session_id="cancel", message="go")]), timeout=60)
    async for event in call:
        if event.WhichOneof("payload") == "tool_call":
            break
    await until(lambda: processes_running("sleep 48.25"))
    call.cancel()
    await until(lambda: not processes_running("sleep 48.25"))
    # The cancelled call still got a result in the transcript, so the next turn replays cleanly.
    messages = []

    async def closed() -> bool:
        messages[:] = await stored(stack, "cancel")
        return [m.role for m in messages] == ["user", "assistant", "tool"]

    deadline = asyncio.get_running_loop().time() + 10
    while not await closed():
        assert asyncio.get_running_loop().time() < deadline, [m.role for m in messages]
        await asyncio.sleep(0.05)
    assert messages[-1].tool_call_id == "slow" and "cancelled" in messages[-1].content


def closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_a_tools_outage_becomes_an_error_result():
    from agentmesh.agent.adapters.tools import GrpcToolRunner
    from agentmesh.agent.types import ToolCall
    from agentmesh.rpc.client import open_channel

    target = f"127.0.0.1:{closed_port()}"
    async with open_channel(target) as channel:
        runner = GrpcToolRunner(ToolsClient(channel, target), timeout_s=5)
        outcome = await runner.execute("s1", ToolCall("c1", "shell", '{"command": "true"}'))
    assert outcome.is_error and outcome.error_kind == "sandbox_unavailable"
    assert target in outcome.output and outcome.call_id == "c1"


async def test_a_memory_outage_fails_the_turn_with_a_clear_error(tmp_path, llm):
    env = {"AGENTMESH_MEMORY_ADDR": f"127.0.0.1:{closed_port()}", "AGENTMESH_TOOLS_ADDR": f"127.0.0.1:{closed_port()}",
           "AGENTMESH_AGENT_MEMORY_TIMEOUT_S": "3", "AGENTMESH_AGENT_RECALL_TIMEOUT_S": "1"}
    stack = Stack(tmp_path / "home", llm_base_url=llm.base_url, env=env, services=("agent",))
    stack.addresses.update(memory=env["AGENTMESH_MEMORY_ADDR"], tools=env["AGENTMESH_TOOLS_ADDR"])
    async with stack:
        request = agent_service_pb2.RunTurnRequest(session_id="s1", message="hi")
        events = [e async for e in agent_stub(stack).RunTurn(iter([request]), timeout=30)]
    kinds = [e.WhichOneof("payload") for e in events]
    assert kinds[0] == "run_started" and kinds[-1] == "error"
    assert events[-1].error.code == "UNAVAILABLE" and "memory service" in events[-1].error.message
    assert llm.requests == []  # nothing was asked of the model without a transcript


async def test_the_builtin_demo_script_runs_against_the_real_tools_and_memory(tmp_path):
    async with Stack(tmp_path / "home", services=SERVICES) as demo:  # no model URL: the scripted provider
        await open_session(demo, "demo")
        request = agent_service_pb2.RunTurnRequest(session_id="demo", message="write a note, read it, remember it")
        events = [e async for e in agent_stub(demo).RunTurn(iter([request]), timeout=60)]
        results = [e.tool_result.result for e in events if e.WhichOneof("payload") == "tool_result"]
        assert [r.name for r in results if r.name.startswith("memory")] == ["memory_save", "memory_search"]
        assert {r.name for r in results} == {"write_file", "read_file", "shell", "memory_save", "memory_search"}
        assert not [r for r in results if r.is_error], [(r.name, r.output) for r in results if r.is_error]
        by_name = {r.name: r for r in results}
        assert "agentmesh runs tool-using LLM agents" in by_name["read_file"].output
        assert "agentmesh runs tool-using LLM agents" in by_name["shell"].stdout
        assert "notes.txt" in by_name["memory_search"].output
        finished = events[-1].run_finished
        assert finished.stop_reason == "completed" and finished.iterations == 5
        assert (demo.settings.home / "workspaces" / "demo" / "notes.txt").exists()
