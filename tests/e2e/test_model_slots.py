"""A model's concurrency limit (max_concurrency), its rate limits, and its key in what it says —
on the five real services, with the scripted model server over real HTTP."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from tests.e2e.conftest import chat, of_kind, transcript
from tests.support.llm_server import ScriptedLLMServer, failure, reply, tool_call
from tests.support.stack import Stack, stack_env
from tests.support.turns import LiveTurn, wait_until

KEY = stack_env(Path("."))["AGENTMESH_LLM_API_KEY"]  # the default model's, as the stack configures it
LIMITED_KEY = "sk-limited-model-key-987654321"


@pytest.fixture
def limited():
    with ScriptedLLMServer() as server:
        yield server


@pytest.fixture
async def stack(tmp_path, llm, limited):
    catalog = tmp_path / "models.yaml"
    catalog.write_text(f"""
models:
  - name: limited
    base_url: {limited.base_url}
    model: limited-model
    api_key_env: LIMITED_KEY
    max_concurrency: 2
""")
    env = {"AGENTMESH_MODELS": str(catalog), "LIMITED_KEY": LIMITED_KEY}
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=env) as running:
        yield running


def waiting_statuses(events) -> list[str]:
    return [s.message for s in of_kind(events, "status") if "waiting for a model slot" in s.message]


async def test_a_turn_past_the_models_limit_says_it_waits_and_all_finish(stack, limited):
    # The model holds its first two answers until the test lets them go: two slots taken.
    gate = threading.Event()

    def held(request):
        gate.wait(30)
        return reply("held answer")

    limited.add(held, held, reply("third answer"))
    gateway = stack.gateway_stub()
    first = LiveTurn(gateway, "slots-1", "one", model="limited")
    second = LiveTurn(gateway, "slots-2", "two", model="limited")
    await asyncio.to_thread(limited.wait_for_requests, 2)
    third = LiveTurn(gateway, "slots-3", "three", model="limited")
    try:
        await wait_until(lambda: waiting_statuses(third.events), timeout=30)
        assert len(limited.requests) == 2  # the third call waits in the agent, not at the model
    finally:
        gate.set()
    events = [await turn.finished() for turn in (first, second, third)]

    assert [of_kind(e, "run_finished")[0].final_text for e in events] == ["held answer", "held answer", "third answer"]
    (said,) = waiting_statuses(events[2])
    assert "'limited'" in said and "2 calls at once" in said and "max_concurrency" in said
    assert not waiting_statuses(events[0]) and not waiting_statuses(events[1])


async def test_a_429_with_retry_after_is_retried_and_the_turn_succeeds(stack, llm):
    llm.add(failure(429, retry_after="0.1", message="slow down"), reply("after the pause"))
    events = await chat(stack.gateway_stub(), "rate-limited", "hi")

    assert of_kind(events, "run_finished")[0].final_text == "after the pause"
    assert any("HTTP 429" in s.message and "retrying" in s.message for s in of_kind(events, "status"))
    assert len(llm.requests) == 2


@pytest.mark.parametrize("key", [KEY, LIMITED_KEY])
async def test_a_model_that_says_a_key_streams_and_saves_it_masked(stack, llm, key):
    # The key split across the stream's 4-character chunks, in the text and in a tool call's arguments.
    llm.add(reply(f"the key is {key}, as asked", tool_call("shell", {"command": f"echo {key}"}), chunk_chars=4),
            reply(f"done; again: {key}.", chunk_chars=3))
    events = await chat(stack.gateway_stub(), "echo-key", "say the key")

    streamed = "".join(d.text for d in of_kind(events, "text_delta"))
    assert streamed == "the key is [redacted], as askeddone; again: [redacted]."
    (call,) = of_kind(events, "tool_call")
    assert key not in call.arguments_json and "[redacted]" in call.arguments_json
    assert key[:8] not in "".join(str(e) for e in events)  # no part of it in any event either
    saved = await transcript(stack.gateway_stub(), "echo-key")
    assert saved and not any(key in str(m) for m in saved)
    assert "[redacted]" in saved[-1].content
    # What was sent back to the model as its own words is masked too.
    assert key not in str(llm.requests[1].body["messages"][1:])
