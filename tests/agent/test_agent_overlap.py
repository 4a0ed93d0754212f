"""The model call after a step's tool results starts beside their append (turn_model.py): over
real gRPC, with the real memory and tools services, and a proxy in front of memory that holds
or refuses the append of a tool result (memory_proxy.py). Whatever the timing, the reply is
neither shown nor persisted before that append is acknowledged, and a failed append leaves no
trace of it."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentmesh.internal.v1 import agent_service_pb2, agent_service_pb2_grpc, memory_service_pb2, memory_service_pb2_grpc
from agentmesh.v1 import sessions_pb2
from tests.agent.memory_proxy import REFUSAL, AppendGate
from tests.support.identities import signed_channel
from tests.support.llm_server import reply, tool_call
from tests.support.stack import Stack
from tests.support.timing import polling

ANSWER = "Done: a.txt holds hello."
# Long enough that a turn waiting for it would be seen waiting.
SLOW_ANSWER_S = 8.0


@pytest.fixture
async def services(tmp_path, llm):
    """Memory and tools, the proxy in front of memory, and the agent behind the proxy."""
    home = tmp_path / "home"
    async with Stack(home, llm_base_url=llm.base_url, services=("memory", "tools")) as backends:
        gate = await AppendGate.start(backends.addresses["memory"])
        agent = Stack(home, llm_base_url=llm.base_url, services=("agent",))
        agent.addresses.update(memory=gate.target, tools=backends.addresses["tools"])
        try:
            async with agent:
                yield backends, gate, agent
        finally:
            await gate.stop()


class Turn:
    """One RunTurn over gRPC, its events gathered as they come; `interrupt` sends the
    interrupt message on the same request stream, as the gateway does."""

    def __init__(self, agent: Stack, session_id: str, message: str):
        self._requests: asyncio.Queue[agent_service_pb2.RunTurnRequest | None] = asyncio.Queue()
        self._requests.put_nowait(agent_service_pb2.RunTurnRequest(session_id=session_id, run_id="r1", message=message))
        self.events: list = []
        stub = agent_service_pb2_grpc.AgentStub(agent.channel("agent"))
        self.done = asyncio.create_task(self._consume(stub))

    async def _send(self):
        while (request := await self._requests.get()) is not None:
            yield request

    async def _consume(self, stub) -> None:
        async for event in stub.RunTurn(self._send(), timeout=30):
            self.events.append(event)
        self._requests.put_nowait(None)

    def interrupt(self) -> None:
        self._requests.put_nowait(agent_service_pb2.RunTurnRequest(interrupt="interrupted"))

    def kinds(self) -> list[str]:
        return [e.WhichOneof("payload") for e in self.events]

    def text(self) -> str:
        return "".join(e.text_delta.text for e in self.events if e.WhichOneof("payload") == "text_delta")


async def stored(backends: Stack, session_id: str) -> list:
    """The transcript as the real memory service has it (not through the proxy)."""
    answer = await backends.memory_stub().ListMessages(sessions_pb2.GetTranscriptRequest(session_id=session_id),
                                                       timeout=10)
    return [(m.role, m.content) for m in answer.messages]


async def open_session(backends: Stack, session_id: str) -> None:
    session = sessions_pb2.Session(session_id=session_id, namespace="default")
    await backends.memory_stub().PutSession(memory_service_pb2.PutSessionRequest(session=session), timeout=10)


async def model_requests(llm, count: int) -> None:
    await asyncio.to_thread(llm.wait_for_requests, count, 10.0)


def spans(home) -> list[dict]:
    return [json.loads(line) for path in (home / "traces").glob("*.jsonl") for line in path.read_text().splitlines()]


async def chat_spans(home, turn: Turn, count: int = 2) -> list[dict]:
    """The turn's `chat` spans (the agent's model calls, from its traces) once `count` have ended."""
    trace_id = turn.events[0].run_started.trace_id
    async for _ in polling(0.05):
        chats = [s for s in spans(home) if s["trace_id"] == trace_id and s["name"].startswith("chat ")]
        if len(chats) >= count:
            return sorted(chats, key=lambda s: s["start"])
    raise AssertionError(f"the turn's {count} model calls never reached the trace store")


def write_then_answer(llm, answer=None) -> None:
    llm.add(reply("", tool_call("write_file", {"path": "a.txt", "content": "hello"}, id="w"), usage=(100, 10)),
            answer or reply(ANSWER, usage=(200, 20)))


async def test_the_reply_waits_for_the_tool_results_acknowledgement(services, llm, tmp_path):
    backends, gate, agent = services
    await open_session(backends, "held")
    write_then_answer(llm)
    gate.hold_answer()
    turn = Turn(agent, "held", "write hello to a.txt")

    # The second model call starts while the result's append is not acknowledged...
    await asyncio.wait_for(gate.seen.wait(), 10)
    await model_requests(llm, 2)
    second = (await chat_spans(tmp_path / "home", turn))[1]  # ...and its whole reply has come back
    assert second["status"] == "OK"
    assert "tool_result" not in turn.kinds() and ANSWER not in turn.text(), turn.kinds()
    assert [role for role, _ in await stored(backends, "held")] == ["user", "assistant", "tool"]
    assert not turn.done.done()

    gate.release.set()
    await asyncio.wait_for(turn.done, 10)
    kinds = turn.kinds()
    assert kinds[-1] == "run_finished" and turn.events[-1].run_finished.final_text == ANSWER
    # The result is shown before any of the reply that follows it.
    after_result = kinds[kinds.index("tool_result"):]
    assert "text_delta" in after_result and "text_delta" not in kinds[:kinds.index("tool_result")]
    assert turn.text() == ANSWER
    assert [role for role, _ in await stored(backends, "held")] == ["user", "assistant", "tool", "assistant"]


async def test_a_failed_result_append_leaves_no_trace_of_the_reply(services, llm, tmp_path):
    backends, gate, agent = services
    await open_session(backends, "refused")
    write_then_answer(llm)
    gate.hold_then_refuse()
    turn = Turn(agent, "refused", "write hello to a.txt")

    await asyncio.wait_for(gate.seen.wait(), 10)
    await model_requests(llm, 2)
    second = (await chat_spans(tmp_path / "home", turn))[1]  # the reply is back before the append fails
    assert second["status"] == "OK"
    gate.release.set()
    await asyncio.wait_for(turn.done, 10)

    kinds = turn.kinds()
    assert kinds[-1] == "error" and REFUSAL in turn.events[-1].error.message
    assert "tool_result" not in kinds and ANSWER not in turn.text()
    assert await stored(backends, "refused") == [("user", "write hello to a.txt"), ("assistant", "")]
    # The thrown-away reply's tokens were spent: the ledger has both calls.
    async with signed_channel(backends.settings.keys_dir, "gateway", "memory", backends.addresses["memory"]) as channel:
        sums = await memory_service_pb2_grpc.MemoryStub(channel).SumUsage(memory_service_pb2.SumUsageRequest(group_by="session"),
                                                                  timeout=10)
    refused = next(s for s in sums.sums if s.key == "refused")
    assert (refused.calls, refused.input_tokens, refused.output_tokens) == (2, 300, 30)


async def test_an_interrupt_while_the_call_runs_beside_the_append_stops_the_call(services, llm):
    backends, gate, agent = services
    await open_session(backends, "stopped")
    write_then_answer(llm, reply(ANSWER, delay_s=SLOW_ANSWER_S))
    gate.hold_answer()
    turn = Turn(agent, "stopped", "write hello to a.txt")

    await asyncio.wait_for(gate.seen.wait(), 10)
    await model_requests(llm, 2)
    turn.interrupt()
    await asyncio.sleep(0.3)
    assert not turn.done.done()  # an interrupt waits for the write in flight (a safe point)
    started = asyncio.get_running_loop().time()
    gate.release.set()
    await asyncio.wait_for(turn.done, 10)

    assert asyncio.get_running_loop().time() - started < SLOW_ANSWER_S / 2  # the call was not waited out
    kinds = turn.kinds()
    assert kinds[-1] == "run_finished" and turn.events[-1].run_finished.stop_reason == "interrupted"
    assert "tool_result" in kinds and ANSWER not in turn.text()
    assert [role for role, _ in await stored(backends, "stopped")] == ["user", "assistant", "tool"]


async def test_a_failed_result_append_cancels_the_call_beside_it(services, llm, tmp_path):
    backends, gate, agent = services
    await open_session(backends, "cut")
    write_then_answer(llm, reply(ANSWER, delay_s=SLOW_ANSWER_S))
    gate.hold_then_refuse()
    turn = Turn(agent, "cut", "write hello to a.txt")

    await asyncio.wait_for(gate.seen.wait(), 10)
    await model_requests(llm, 2)
    started = asyncio.get_running_loop().time()
    gate.release.set()  # refused while the model is still answering
    await asyncio.wait_for(turn.done, 10)
    assert asyncio.get_running_loop().time() - started < SLOW_ANSWER_S / 2
    assert turn.kinds()[-1] == "error" and ANSWER not in turn.text()

    # The call was stopped, not left to run: its chat span ends, cancelled, within the turn.
    first, second = await chat_spans(tmp_path / "home", turn)
    assert (second["status"], second["attributes"]["error.type"]) == ("ERROR", "cancelled")
    assert second["parent_span_id"] == first["parent_span_id"]  # under the turn's invoke_agent, like any call
