"""The model providers against a real HTTP server speaking the OpenAI and Anthropic wire protocols."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from agentmesh.agent.providers import AnthropicProvider, OpenAIProvider, RetryPolicy, ScriptedProvider
from agentmesh.agent.providers.base import build_timeout, retry_after_s
from agentmesh.agent.providers.openai import Encoded, message_key, openai_body, to_openai_message
from agentmesh.agent.providers.scripted import DEMO_SCRIPT, load_script
from agentmesh.agent.types import ChatMessage, ModelReply, ModelRequest, Retrying, TextChunk, ToolCall, ToolSpec
from agentmesh.config import ConfigError
from agentmesh.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from tests.support.llm_server import ScriptedLLMServer, drop, failure, reply, tool_call

KEY = "sk-test-provider-key-0123456789"
FAST = RetryPolicy(max_retries=3, base_s=0.01, max_s=0.05)
SHELL = ToolSpec("shell", "Run a command", {"type": "object", "properties": {"command": {"type": "string"}}})
READ = ToolSpec("read_file", "Read a file", {"type": "object", "properties": {"path": {"type": "string"}}})


def request(*messages: ChatMessage, allow_tools: bool = True) -> ModelRequest:
    msgs = list(messages) or [ChatMessage("system", "be brief"), ChatMessage("user", "hello")]
    return ModelRequest(model="test-model", messages=msgs, tools=[SHELL, READ], allow_tools=allow_tools)


async def run(provider, req: ModelRequest | None = None) -> tuple[list, ModelReply]:
    items = [item async for item in provider.stream(req or request())]
    assert isinstance(items[-1], ModelReply)
    assert not any(isinstance(i, ModelReply) for i in items[:-1])
    return items[:-1], items[-1]


def openai(http: httpx.AsyncClient, llm: ScriptedLLMServer, retry: RetryPolicy = FAST) -> OpenAIProvider:
    return OpenAIProvider(http, llm.base_url, KEY, retry)


LONG_COMMAND = "for i in 1 2 3; do echo \"line $i with \\\"quotes\\\" and ünïcode\"; done"


async def test_openai_reassembles_split_arguments_of_several_interleaved_calls(http):
    steps = [reply("Let me check.", tool_call("shell", {"command": LONG_COMMAND}, id="call_a"),
                   tool_call("read_file", {"path": "notes/a.txt"}, id="call_b"),
                   chunk_chars=3, interleave=True, usage=(123, 45))]
    with ScriptedLLMServer(steps) as llm:
        events, final = await run(openai(http, llm))

    texts = [e.text for e in events if isinstance(e, TextChunk)]
    assert len(texts) > 1 and "".join(texts) == "Let me check." == final.text
    assert [(c.call_id, c.name, json.loads(c.arguments_json)) for c in final.tool_calls] == [
        ("call_a", "shell", {"command": LONG_COMMAND}),
        ("call_b", "read_file", {"path": "notes/a.txt"}),
    ]
    assert (final.usage.input_tokens, final.usage.output_tokens) == (123, 45)
    assert final.model == "test-model" and final.finish_reason == "tool_calls"


async def test_openai_request_carries_stream_usage_tools_and_the_key_in_a_header(http):
    with ScriptedLLMServer([reply("hi")]) as llm:
        await run(openai(http, llm))
        sent = llm.requests[0]
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    assert sent.body["stream"] is True and sent.body["stream_options"] == {"include_usage": True}
    assert sent.body["model"] == "test-model" and sent.body["tool_choice"] == "auto"
    assert [t["function"]["name"] for t in sent.body["tools"]] == ["shell", "read_file"]
    assert sent.body["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]


def test_a_history_made_anew_is_encoded_once_and_a_message_that_differs_again():
    # Every turn makes its history anew from the transcript: equal messages, new objects.
    encoded = []

    def to_json(m: ChatMessage) -> dict:
        encoded.append(m.content)
        return to_openai_message(m)

    cache = Encoded(to_json, max_items=100, max_chars=100_000, key=message_key)

    def history(result: str, call_id: str = "c1") -> list[ChatMessage]:
        return [ChatMessage("user", "run true", seq=1),
                ChatMessage("assistant", tool_calls=(ToolCall(call_id, "shell", '{"command": "true"}'),), seq=2),
                ChatMessage("tool", result, tool_call_id=call_id, name="shell", seq=3)]

    first = [cache(m) for m in history("(no output)")]
    assert [cache(m) for m in history("(no output)")] == first
    assert encoded == ["run true", "", "(no output)"]
    for changed in (history("[exit 1]"), history("(no output)", call_id="c2")):
        assert [json.loads(cache(m)) for m in changed] == [to_openai_message(m) for m in changed]
    assert encoded == ["run true", "", "(no output)", "[exit 1]", "", "(no output)"]


async def test_openai_sends_each_calls_own_messages_and_catalog_though_both_are_encoded_once(http):
    # Each call's body is exactly openai_body's JSON, whatever changed between calls: a tool
    # added, one dropped, one replaced by a spec of the same name, tools turned off; the same
    # history objects sent again, one of them replaced by another with other content.
    renamed = ToolSpec("shell", "Run a command, now with a timeout", {"type": "object", "properties": {
        "command": {"type": "string"}, "timeout_s": {"type": "number", "description": "höchstens 60"}}})
    history = [ChatMessage("user", "run true"),
               ChatMessage("assistant", tool_calls=(ToolCall("c1", "shell", '{"command": "true"}'),)),
               ChatMessage("tool", "(no output)", tool_call_id="c1", name="shell"), ChatMessage("assistant", "done ✓")]
    edited = [*history[:2], ChatMessage("tool", "[exit 1]", tool_call_id="c1", name="shell"), history[3]]
    catalogs = [[SHELL, READ], [SHELL, READ], [READ], [renamed, READ], [], [renamed]]
    histories = [history, history, edited, history, edited, []]
    requests = [ModelRequest(model="test-model", messages=[ChatMessage("system", f"call {n}"), *past, ChatMessage("user", "go")],
                             tools=tools, allow_tools=n != 5, max_tokens=100)
                for n, (tools, past) in enumerate(zip(catalogs, histories, strict=True))]
    with ScriptedLLMServer([reply("ok") for _ in requests]) as llm:
        provider = openai(http, llm)
        for req in requests:
            await run(provider, req)
        sent = [r.body for r in llm.requests]
    assert sent == [openai_body(req) for req in requests]
    assert sent[2]["messages"][3]["content"] == "[exit 1]" and sent[3]["messages"][3]["content"] == "(no output)"
    assert sent[3]["tools"][0]["function"]["parameters"]["properties"]["timeout_s"]["description"] == "höchstens 60"
    assert "tools" not in sent[4] and sent[5]["tool_choice"] == "none"


async def test_openai_replays_tool_calls_and_results_in_the_openai_format(http):
    history = request(
        ChatMessage("user", "run it"),
        ChatMessage("assistant", "", tool_calls=(ToolCall("c1", "shell", '{"command": "ls"}'),)),
        ChatMessage("tool", "a.txt", tool_call_id="c1", name="shell"),
        allow_tools=False,
    )
    with ScriptedLLMServer([reply("summary")]) as llm:
        await run(openai(http, llm), history)
        body = llm.requests[0].body
    assert body["messages"][1:] == [
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "shell", "arguments": '{"command": "ls"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
    ]
    assert body["tool_choice"] == "none"


async def test_openai_retries_a_503_then_succeeds(http):
    with ScriptedLLMServer([failure(503), reply("ok")]) as llm:
        events, final = await run(openai(http, llm))
        assert len(llm.requests) == 2
    retries = [e for e in events if isinstance(e, Retrying)]
    assert [(r.attempt, r.max_attempts, r.reason) for r in retries] == [(1, 4, "HTTP 503")]
    assert final.text == "ok"


async def test_openai_honours_retry_after_on_429(http):
    with ScriptedLLMServer([failure(429, retry_after=1), reply("ok")]) as llm:
        events, final = await run(openai(http, llm))
        first, second = llm.requests
    retry = next(e for e in events if isinstance(e, Retrying))
    # As asked, plus a jitter of at most a quarter: never sooner, and not a burst's calls in step.
    assert 1.0 <= retry.delay_s <= 1.25 and retry.reason == "HTTP 429"
    assert second.received_at - first.received_at >= 0.9  # waited at least as asked (lower bound only)
    assert final.text == "ok"


def test_retry_after_forms():
    assert retry_after_s({"retry-after": "2"}) == 2.0
    assert retry_after_s({"retry-after-ms": "250"}) == 0.25
    assert retry_after_s({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0  # a date in the past
    assert retry_after_s({"retry-after": "soon"}) is None and retry_after_s({}) is None


async def test_openai_does_not_wait_longer_than_the_retry_after_cap(http):
    with ScriptedLLMServer([failure(429, retry_after=3600), reply("never")]) as llm:
        with pytest.raises(ResourceExhausted) as info:
            await run(openai(http, llm))
        assert len(llm.requests) == 1
    assert "3600s" in info.value.message


async def test_openai_gives_up_after_the_configured_retries(http):
    with ScriptedLLMServer([failure(503, message="busy")] * 4) as llm:
        with pytest.raises(Unavailable) as info:
            await run(openai(http, llm))
        assert len(llm.requests) == 4
        assert llm.base_url in info.value.message
    assert "HTTP 503 after 4 attempts: busy" in info.value.message


async def test_openai_retries_a_dropped_connection_before_any_answer(http):
    with ScriptedLLMServer([drop(), reply("ok")]) as llm:
        events, final = await run(openai(http, llm))
        assert len(llm.requests) == 2
    assert any(isinstance(e, Retrying) for e in events) and final.text == "ok"


async def test_openai_never_retries_once_the_stream_began(http):
    steps = [reply("a long answer that is cut off", chunk_chars=2, drop_after_chunks=4), reply("second try")]
    with ScriptedLLMServer(steps) as llm:
        seen = []
        with pytest.raises(Unavailable) as info:
            async for item in openai(http, llm).stream(request()):
                seen.append(item)
        assert len(llm.requests) == 1
    assert any(isinstance(i, TextChunk) for i in seen)
    assert "broke off its answer" in info.value.message and "not retried" in info.value.message


async def test_openai_read_timeout_before_the_head_is_retried(http):
    with ScriptedLLMServer([reply("slow", delay_s=3), reply("fast")]) as llm:
        async with httpx.AsyncClient(timeout=build_timeout(0.5, 0.5)) as short:
            events, final = await run(OpenAIProvider(short, llm.base_url, KEY, FAST))
        assert len(llm.requests) == 2
    assert final.text == "fast"
    assert next(e for e in events if isinstance(e, Retrying)).reason == "no answer within the read timeout"


async def test_openai_timeouts_exhausted_end_with_deadline_exceeded(http):
    with ScriptedLLMServer([reply("slow", delay_s=3)] * 2) as llm:
        async with httpx.AsyncClient(timeout=build_timeout(0.3, 0.3)) as short:
            with pytest.raises(DeadlineExceeded) as info:
                await run(OpenAIProvider(short, llm.base_url, KEY, RetryPolicy(max_retries=1, base_s=0.01)))
    assert "did not answer" in info.value.message and "2 attempts" in info.value.message


async def test_openai_stall_mid_stream_is_an_error_not_a_retry(http):
    steps = [reply("stalls after a while", chunk_chars=2, pause_after_chunks=3, pause_s=3), reply("never")]
    with ScriptedLLMServer(steps) as llm:
        async with httpx.AsyncClient(timeout=build_timeout(0.5, 0.5)) as short:
            with pytest.raises(Unavailable) as info:
                await run(OpenAIProvider(short, llm.base_url, KEY, FAST))
        assert len(llm.requests) == 1
    assert "read timeout" in info.value.message


async def test_unreachable_server_names_the_url_and_never_the_key(http):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    with pytest.raises(Unavailable) as info:
        await run(OpenAIProvider(http, url, KEY, RetryPolicy(max_retries=2, base_s=0.01)))
    message = info.value.message
    assert f"{url}/chat/completions" in message and "could not be reached after 3 attempts" in message
    assert KEY not in message


async def test_rejected_key_is_not_retried_and_not_echoed(http):
    with ScriptedLLMServer([failure(401, message=f"Incorrect API key provided: {KEY}")]) as llm:
        with pytest.raises(Unauthenticated) as info:
            await run(openai(http, llm))
        assert len(llm.requests) == 1
    assert KEY not in info.value.message and "[redacted]" in info.value.message
    assert "AGENTMESH_LLM_API_KEY" in info.value.message


async def test_bad_request_is_invalid_argument_without_retry(http):
    with ScriptedLLMServer([failure(400, message="model 'x' does not support tools")]) as llm:
        with pytest.raises(InvalidArgument) as info:
            await run(openai(http, llm))
        assert len(llm.requests) == 1
    assert "does not support tools" in info.value.message


async def test_openai_accepts_a_server_that_ignores_streaming(http):
    with ScriptedLLMServer([reply("plain", tool_call("shell", {"command": "ls"}), usage=(7, 3), as_json=True)]) as llm:
        events, final = await run(openai(http, llm))
    assert [e.text for e in events] == ["plain"]
    assert final.tool_calls[0].name == "shell" and json.loads(final.tool_calls[0].arguments_json) == {"command": "ls"}
    assert final.usage.input_tokens == 7


async def test_anthropic_streams_text_and_split_tool_input(http):
    steps = [reply("Checking.", tool_call("shell", {"command": LONG_COMMAND}, id="toolu_1"),
                   tool_call("read_file", {"path": "a.txt"}, id="toolu_2"), chunk_chars=3, usage=(50, 9))]
    with ScriptedLLMServer(steps) as llm:
        events, final = await run(AnthropicProvider(http, llm.base_url, KEY, FAST))
        sent = llm.requests[0]
    assert "".join(e.text for e in events if isinstance(e, TextChunk)) == "Checking." == final.text
    assert [(c.call_id, c.name, json.loads(c.arguments_json)) for c in final.tool_calls] == [
        ("toolu_1", "shell", {"command": LONG_COMMAND}),
        ("toolu_2", "read_file", {"path": "a.txt"}),
    ]
    assert (final.usage.input_tokens, final.usage.output_tokens) == (50, 9)
    assert sent.path == "/v1/messages"
    assert sent.headers["x-api-key"] == KEY and sent.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in sent.headers
    assert sent.body["system"] == "be brief" and sent.body["stream"] is True and sent.body["max_tokens"] > 0
    assert sent.body["tools"][0] == {"name": "shell", "description": "Run a command", "input_schema": SHELL.parameters}


async def test_anthropic_replays_tool_use_and_tool_results_as_blocks(http):
    history = request(
        ChatMessage("system", "sys"),
        ChatMessage("user", "run both"),
        ChatMessage("assistant", "ok", tool_calls=(ToolCall("t1", "shell", '{"command": "ls"}'),
                                                   ToolCall("t2", "read_file", '{"path": "a"}'))),
        ChatMessage("tool", "a.txt", tool_call_id="t1", name="shell"),
        ChatMessage("tool", "error: no such file", tool_call_id="t2", name="read_file"),
        ChatMessage("system", "summarise now"),
        allow_tools=False,
    )
    with ScriptedLLMServer([failure(529), reply("summary")]) as llm:
        _, final = await run(AnthropicProvider(http, llm.base_url, KEY, FAST), history)
        body = llm.requests[-1].body
    assert final.text == "summary"
    assert body["system"] == "sys" and body["tool_choice"] == {"type": "none"}
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "run both"}]},
        {"role": "assistant", "content": [
            {"type": "text", "text": "ok"},
            {"type": "tool_use", "id": "t1", "name": "shell", "input": {"command": "ls"}},
            {"type": "tool_use", "id": "t2", "name": "read_file", "input": {"path": "a"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "a.txt"},
            {"type": "tool_result", "tool_use_id": "t2", "content": "error: no such file"},
            {"type": "text", "text": "summarise now"},
        ]},
    ]


async def test_scripted_provider_streams_like_a_real_one():
    provider = ScriptedProvider(DEMO_SCRIPT)
    events, first = await run(provider, request(ChatMessage("user", "write a note")))
    assert len([e for e in events if isinstance(e, TextChunk)]) > 1
    assert [c.name for c in first.tool_calls] == ["write_file"]
    assert json.loads(first.tool_calls[0].arguments_json)["path"] == "notes.txt"
    # The next reply is chosen by how many assistant messages follow the user's message.
    later = request(
        ChatMessage("user", "write a note"),
        ChatMessage("assistant", first.text, tool_calls=first.tool_calls),
        ChatMessage("tool", "ok", tool_call_id=first.tool_calls[0].call_id),
    )
    _, second = await run(provider, later)
    assert [c.name for c in second.tool_calls] == ["read_file", "shell"]
    # Asked for a tool-less summary, it drops tool calls.
    _, summary = await run(provider, request(ChatMessage("user", "x"), allow_tools=False))
    assert summary.tool_calls == () and summary.text


def test_load_script_reports_problems(tmp_path):
    assert load_script("") is DEMO_SCRIPT
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps([{"text": "hi"}]))
    assert load_script(str(bare)) == {"turns": [{"replies": [{"text": "hi"}]}]}
    broken = tmp_path / "broken.json"
    broken.write_text("{nope")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_script(str(broken))
    with pytest.raises(ConfigError, match="cannot read"):
        load_script(str(tmp_path / "missing.json"))
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"turns": [{"text": "no replies"}]}))
    with pytest.raises(ConfigError, match="turn 0 needs a list of replies"):
        load_script(str(wrong))


async def test_a_url_without_scheme_fails_at_once_with_a_hint(http):
    with pytest.raises(FailedPrecondition) as info:
        await run(OpenAIProvider(http, "localhost:11434/v1", KEY, FAST))
    assert "AGENTMESH_LLM_BASE_URL" in info.value.message and "localhost:11434/v1" in info.value.message


@pytest.mark.parametrize("cls", [OpenAIProvider, AnthropicProvider])
async def test_consecutive_calls_reuse_the_connection(http, cls):
    with ScriptedLLMServer([reply("one", tool_call("shell", {"command": "ls"})), reply("two")]) as llm:
        provider = cls(http, llm.base_url, KEY, FAST)
        await run(provider)
        await run(provider)
        first, second = llm.requests
    assert first.peer == second.peer  # the stream was read to its end, so the connection went back to the pool


async def test_a_web_page_instead_of_a_model_api_is_named_as_such(http):
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Page(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["content-length"]))
            body = b"<html>sign in</html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        for cls in (OpenAIProvider, AnthropicProvider):
            with pytest.raises(FailedPrecondition) as info:
                await run(cls(http, f"http://127.0.0.1:{server.server_port}/v1", KEY, FAST))
            assert "text/html, not an event stream" in info.value.message
    finally:
        server.shutdown()
        server.server_close()
