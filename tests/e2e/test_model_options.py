"""What a catalogue model's entry changes on the wire (AGENTMESH_MODELS): its sampling parameters
reach the provider with every request, and `text_tool_calls` lets a model without native
function calling use tools by writing <tool_call>{json}</tool_call> in its reply — each model a
scripted server of its own, over real HTTP and gRPC."""

from __future__ import annotations

import json

import pytest

from agentmesh.config import ConfigError
from agentmesh.models import load_model_file
from tests.e2e.conftest import chat, of_kind, transcript
from tests.support.llm_server import ScriptedLLMServer, reply
from tests.support.stack import Stack


@pytest.fixture
def tuned():
    with ScriptedLLMServer() as server:
        yield server


@pytest.fixture
def local():
    with ScriptedLLMServer(check_protocol=True) as server:
        yield server


@pytest.fixture
async def stack(tmp_path, llm, tuned, local):
    catalog = tmp_path / "models.yaml"
    catalog.write_text(f"""
models:
  - name: tuned
    base_url: {tuned.base_url}
    model: tuned-model
    temperature: 0.2
    top_p: 0.9
    max_output_tokens: 256
  - name: local
    base_url: {local.base_url}
    model: tiny-local
    text_tool_calls: true
""")
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env={"AGENTMESH_MODELS": str(catalog)}) as running:
        yield running


async def test_sampling_parameters_of_the_model_file_reach_the_provider(stack, llm, tuned):
    tuned.add(reply("tuned answer"))
    llm.add(reply("default answer"))
    gateway = stack.gateway_stub()
    assert of_kind(await chat(gateway, "t", "hi", model="tuned"), "run_finished")[0].final_text == "tuned answer"
    await chat(gateway, "t", "and the default?")
    (sent,) = tuned.requests
    assert (sent.body["temperature"], sent.body["top_p"], sent.body["max_tokens"]) == (0.2, 0.9, 256)
    # The default model has none configured: nothing is sent, the server's defaults apply.
    assert "temperature" not in llm.requests[0].body and "top_p" not in llm.requests[0].body


async def test_a_model_without_function_calling_uses_tools_written_in_its_text(stack, local):
    call = {"name": "shell", "arguments": {"command": "echo from-text-call"}}
    local.add(reply(f"Let me check.\n<tool_call>{json.dumps(call)}</tool_call>", chunk_chars=3),
              reply("The shell said from-text-call."))
    events = await chat(stack.gateway_stub(), "weak", "run the echo", model="local")
    finished = of_kind(events, "run_finished")[0]
    assert finished.final_text == "The shell said from-text-call.", of_kind(events, "error")
    (started,) = of_kind(events, "tool_call")
    assert started.name == "shell" and json.loads(started.arguments_json) == call["arguments"]
    (result,) = of_kind(events, "tool_result")
    assert not result.result.is_error and "from-text-call" in result.result.output
    streamed = "".join(e.text for e in of_kind(events, "text_delta"))
    assert "<tool_call>" not in streamed and streamed.startswith("Let me check.")

    first, second = local.requests
    assert "tools" not in first.body and "tool_choice" not in first.body
    assert '<tool_call>{"name": "TOOL_NAME"' in first.messages[0]["content"]
    assert "- shell: " in first.messages[0]["content"]
    # The history goes back in the same text form: no tool roles for a server that knows none.
    assert [m["role"] for m in second.messages] == ["system", "user", "assistant", "user"]
    assert second.messages[2]["content"] == f"Let me check.\n<tool_call>{json.dumps(call)}</tool_call>"
    assert second.messages[3]["content"].startswith(f'<tool_result name="shell" call_id="{started.call_id}">')
    assert "from-text-call" in second.messages[3]["content"]
    # Stored as a real tool call, so the session can go on with any model.
    stored = await transcript(stack.gateway_stub(), "weak")
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert stored[1].tool_calls[0].name == "shell" and stored[1].content == "Let me check."


def test_a_bad_sampling_parameter_or_flag_is_a_clear_config_error(tmp_path):
    path = tmp_path / "m.yaml"
    for entry, says in (("temperature: 3", "temperature must be between 0 and 2"),
                        ("top_p: 0", "top_p must be above 0 and at most 1"),
                        ("text_tool_calls: maybe", "text_tool_calls must be true or false, got 'maybe'")):
        path.write_text(f"models:\n  - name: m\n    base_url: http://x/v1\n    model: m\n    {entry}\n")
        with pytest.raises(ConfigError, match=says):
            load_model_file(str(path), {})
