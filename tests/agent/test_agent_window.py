"""The context budget follows the model's window: a long session on a small-window model never
sends a request over its window (compacting between steps when it must) and still finishes; on
a large-window model the whole history is kept. The scripted model server (OpenAI wire
protocol, over real sockets) counts each request's prompt tokens by a fixed rule and reports
them as usage, as a real server would; the agent learns its ratio from them."""

from __future__ import annotations

import json
import math

from agentmesh.agent.capabilities import compaction
from agentmesh.agent.capabilities.registry import for_turn
from agentmesh.agent.loop.model_choice import NamedModel
from agentmesh.agent.loop.run import Agent, TurnRequest
from agentmesh.agent.providers import OpenAIProvider, RetryPolicy
from agentmesh.agent.settings import AgentSettings
from agentmesh.agent.types import RunFinishedEvent, StatusEvent, ToolCall, ToolOutcome
from tests.agent.agent_fakes import FakeTools
from tests.agent.test_agent_compaction import NOW, NumberedTranscripts
from tests.support.llm_server import RecordedRequest, ScriptedLLMServer, reply, tool_call

# The server's "tokenizer": 3.5 characters of the request's JSON per token. The agent is not told.
CHARS_PER_TOKEN = 3.5
OUTPUT = ("lorem ipsum dolor sit amet consectetur " * 60)[:2048]  # 2 KB of tool output per call


def prompt_tokens(body: dict) -> int:
    return math.ceil(len(json.dumps(body.get("messages", [])) + json.dumps(body.get("tools", []))) / CHARS_PER_TOKEN)


def is_summary(request: RecordedRequest) -> bool:
    return request.messages[0]["content"] == compaction.INSTRUCTION


class Model:
    """Asks for `calls_per_turn` shell calls a turn, one per step, then answers; writes summaries
    and plans when asked. Every reply reports the request's prompt tokens by the fixed rule."""

    def __init__(self, calls_per_turn: int):
        self.calls_per_turn = calls_per_turn
        self.calls_this_turn = 0
        self.total_calls = 0

    def __call__(self, request: RecordedRequest):
        usage = (prompt_tokens(request.body), 20)
        if is_summary(request):
            return reply(f"SUMMARY: {self.total_calls} shell calls so far, all of them read parts.", usage=usage)
        if request.body.get("tool_choice") == "none":  # deep work's plan, a reflection, a summary at the limit
            return reply("1. read every part\n2. report", usage=usage)
        said = [m for m in request.messages if m["role"] != "system"]
        if said and said[-1]["role"] == "user":  # a turn's first step: a new round of calls
            self.calls_this_turn = 0
        if self.calls_this_turn < self.calls_per_turn:
            self.calls_this_turn += 1
            self.total_calls += 1
            return reply("", tool_call("shell", {"command": f"cat part{self.total_calls}"}), usage=usage)
        return reply(f"Read {self.total_calls} parts.", usage=usage)


async def shell(call: ToolCall) -> ToolOutcome:
    return ToolOutcome(call_id=call.call_id, name=call.name, output=OUTPUT)


def make_agent(http, llm, telemetry, window: int) -> tuple[Agent, FakeTools, NumberedTranscripts]:
    settings = AgentSettings(retry_base_s=0.01, recall_k=0, deep_max_iterations=250, max_iterations_cap=250,
                             max_iterations=250, repeat_limit=0)
    provider = OpenAIProvider(http, llm.base_url, "", RetryPolicy(max_retries=1, base_s=0.01))
    tools, transcripts = FakeTools({"shell": shell}), NumberedTranscripts()
    named = {"small": NamedModel("small", provider, "small-model", context_window=window)}
    agent = Agent(provider, tools, transcripts, None, settings, model="default-model", telemetry=telemetry,
                  capabilities=for_turn, clock=lambda: NOW, models=named)
    return agent, tools, transcripts


async def run(agent: Agent, run_id: str, mode: str = "") -> list:
    request = TurnRequest("s1", run_id, "read every part and report", model="small", mode=mode)
    return [e async for e in agent.start(request).events()]


def check_fits(requests: list[RecordedRequest], window: int) -> None:
    # What a request may take: the window less the eighth kept for the answer (no max_tokens set).
    room = window - window // 8
    sizes = [prompt_tokens(r.body) for r in requests]
    assert max(sizes) <= room, f"a request of {max(sizes)} tokens for a {window}-token window"


def fill_of(events) -> StatusEvent:
    return [e for e in events if isinstance(e, StatusEvent) and e.context_window][-1]


async def test_one_deep_turn_of_200_calls_fits_an_8k_window_by_compacting_mid_turn(http, telemetry):
    with ScriptedLLMServer(default=Model(200)) as llm:
        agent, tools, transcripts = make_agent(http, llm, telemetry, 8192)
        events = await run(agent, "r1", mode="deep")
        requests = llm.requests

    finished = events[-1]
    assert isinstance(finished, RunFinishedEvent) and finished.stop_reason == "completed"
    assert len(tools.calls) == 200 and finished.final_text == "Read 200 parts."
    check_fits(requests, 8192)
    # Summaries were written between the turn's steps (not only before its first call).
    first_step = next(i for i, r in enumerate(requests) if not is_summary(r))
    mid_turn = [i for i, r in enumerate(requests) if is_summary(r) and i > first_step]
    assert len(mid_turn) >= 2
    # Durable: the summaries are in the transcript.
    assert [m for m in transcripts.history["s1"] if m.kind == "summary"]
    # The context-fill figure: the server's count of the last request against the window.
    fill = fill_of(events)
    assert fill.context_window == 8192 and 0 < fill.context_tokens <= 8192 - 1024
    assert fill.message.startswith("context: ") and fill.message.endswith("%)")
    # The learned ratio is close to the server's rule (the estimate strays by little).
    learned = agent.calibration.ratio("small")
    assert 0.8 * CHARS_PER_TOKEN <= learned <= 1.2 * CHARS_PER_TOKEN


async def test_many_turns_fit_an_8k_window_and_keep_their_summary(http, telemetry):
    with ScriptedLLMServer(default=Model(20)) as llm:
        agent, tools, transcripts = make_agent(http, llm, telemetry, 8192)
        finals = []
        for i in range(10):
            events = await run(agent, f"r{i}")
            finals.append(events[-1])
        requests = llm.requests

    assert [f.stop_reason for f in finals] == ["completed"] * 10 and len(tools.calls) == 200
    check_fits(requests, 8192)
    assert sum(is_summary(r) for r in requests) >= 5
    assert len([m for m in transcripts.history["s1"] if m.kind == "summary"]) >= 5
    # Each later turn starts from a summary, not from the whole conversation.
    last_turn_first = next(r for r in reversed(requests) if not is_summary(r) and len(r.messages) <= 4)
    assert "Summary of this conversation" in json.dumps(last_turn_first.messages)


async def test_a_131k_window_keeps_the_whole_history(http, telemetry):
    with ScriptedLLMServer(default=Model(200)) as llm:
        agent, tools, _ = make_agent(http, llm, telemetry, 131_072)
        events = await run(agent, "r1", mode="deep")
        requests = llm.requests

    assert events[-1].stop_reason == "completed" and len(tools.calls) == 200
    check_fits(requests, 131_072)
    assert not any(is_summary(r) for r in requests)
    # The last request still holds every call of the turn and the user's message.
    last = requests[-1].messages
    assert sum(1 for m in last if m["role"] == "assistant" and m.get("tool_calls")) == 200
    assert any(m["role"] == "user" and m["content"] == "read every part and report" for m in last)
    assert "left out" not in last[0]["content"]
