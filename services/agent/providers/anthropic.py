"""Anthropic Messages API over httpx: `POST {base}/messages` with `stream: true`.

Set AGENTMESH_LLM_BASE_URL=https://api.anthropic.com/v1. The stream is a sequence of named
SSE events: message_start (input usage), content_block_start (a text block, or a tool_use
block with id and name), content_block_delta (text_delta, or input_json_delta carrying a piece
of the tool input JSON), content_block_stop, message_delta (stop_reason, output usage),
message_stop; `ping` and unknown events are ignored, `error` ends the call.
"""

from __future__ import annotations

import base64
import json
from typing import Any, AsyncIterator

import httpx
from httpx_sse import EventSource, SSEError

from agentmesh.agent.providers.base import (
    HttpStreamOpener,
    Redactor,
    RetryPolicy,
    broken_stream_error,
    check_stream_type,
    drain,
)
from agentmesh.agent.types import (
    ChatMessage,
    ImageRef,
    ModelEvent,
    ModelReply,
    ModelRequest,
    ReasoningChunk,
    TextChunk,
    ToolCall,
    ToolSpec,
    Usage,
)
from agentmesh.errors import Unavailable

ANTHROPIC_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 4096


def _input_object(arguments_json: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments_json or "{}")
    except (json.JSONDecodeError, RecursionError):
        # The model once wrote bad (or absurdly nested) JSON; replay it as a string so the history stays faithful.
        return {"_raw": arguments_json}
    return value if isinstance(value, dict) else {"_value": value}


def image_block(image: ImageRef) -> dict[str, Any]:
    """An image as Anthropic's image block, its bytes inline as base64."""
    return {"type": "image", "source": {"type": "base64", "media_type": image.media_type,
                                        "data": base64.b64encode(image.data).decode("ascii")}}


def to_anthropic(messages: list[ChatMessage]) -> tuple[str, list[dict[str, Any]]]:
    """System text and alternating user/assistant messages. Tool results become tool_result
    blocks of a user message; consecutive same-role messages merge, as the API requires."""
    system_parts: list[str] = []
    out: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": list(blocks)})

    for m in messages:
        if m.role == "system":
            if not out:
                system_parts.append(m.content)
            else:  # a late instruction (e.g. "summarise now") keeps its place as user text
                add("user", [{"type": "text", "text": m.content}])
        elif m.role == "user":
            said = [{"type": "text", "text": m.content}] if m.content else []
            said.extend(image_block(i) for i in m.images)
            add("user", said or [{"type": "text", "text": "(empty)"}])
        elif m.role == "assistant":
            blocks: list[dict[str, Any]] = []
            if m.content:
                blocks.append({"type": "text", "text": m.content})
            for c in m.tool_calls:
                blocks.append({"type": "tool_use", "id": c.call_id, "name": c.name, "input": _input_object(c.arguments_json)})
            add("assistant", blocks or [{"type": "text", "text": "(no answer)"}])
        elif m.role == "tool":
            content: str | list[dict[str, Any]] = m.content
            if m.images:  # a tool result may hold image blocks beside its text
                content = [{"type": "text", "text": m.content or "(no text)"}, *(image_block(i) for i in m.images)]
            add("user", [{"type": "tool_result", "tool_use_id": m.tool_call_id, "content": content}])
    return "\n\n".join(p for p in system_parts if p), out


def to_anthropic_tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    return [{"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools]


def anthropic_body(request: ModelRequest) -> dict[str, Any]:
    system, messages = to_anthropic(request.messages)
    body: dict[str, Any] = {
        "model": request.model,
        "max_tokens": request.max_tokens or DEFAULT_MAX_TOKENS,
        "messages": messages,
        "stream": True,
    }
    if system:
        body["system"] = system
    if request.tools:
        body["tools"] = to_anthropic_tools(request.tools)
        body["tool_choice"] = {"type": "auto" if request.allow_tools else "none"}
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.top_p is not None:
        body["top_p"] = request.top_p
    return body


class AnthropicStreamAssembler:
    def __init__(self) -> None:
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._blocks: dict[int, dict[str, Any]] = {}
        self._usage = Usage()
        self.model = ""
        self.stop_reason = ""
        self.done = False

    def feed(self, event: str, data: dict[str, Any]) -> list[TextChunk | ReasoningChunk]:
        kind = data.get("type", event)
        if kind == "message_start":
            message = data.get("message") or {}
            self.model = message.get("model") or self.model
            usage = message.get("usage") or {}
            # Anthropic counts cache reads and writes apart from input_tokens; ours is every
            # prompt token, of which cached_input_tokens came from the cache.
            cache_read = int(usage.get("cache_read_input_tokens") or 0)
            cache_write = int(usage.get("cache_creation_input_tokens") or 0)
            self._usage.input_tokens = int(usage.get("input_tokens") or 0) + cache_read + cache_write
            self._usage.cached_input_tokens = cache_read
            self._usage.output_tokens = int(usage.get("output_tokens") or 0)
        elif kind == "content_block_start":
            block = data.get("content_block") or {}
            self._blocks[int(data.get("index", len(self._blocks)))] = {
                "type": block.get("type"),
                "id": block.get("id", ""),
                "name": block.get("name", ""),
                "json": [],
            }
            if block.get("type") == "text" and block.get("text"):
                self._text.append(block["text"])
                return [TextChunk(block["text"])]
        elif kind == "content_block_delta":
            delta = data.get("delta") or {}
            slot = self._blocks.setdefault(int(data.get("index", 0)), {"type": "text", "id": "", "name": "", "json": []})
            if delta.get("type") == "text_delta" and delta.get("text"):
                self._text.append(delta["text"])
                return [TextChunk(delta["text"])]
            if delta.get("type") == "thinking_delta" and delta.get("thinking"):  # extended thinking
                self._reasoning.append(delta["thinking"])
                return [ReasoningChunk(delta["thinking"])]
            if delta.get("type") == "input_json_delta":
                slot["json"].append(delta.get("partial_json", ""))
        elif kind == "message_delta":
            self.stop_reason = (data.get("delta") or {}).get("stop_reason") or self.stop_reason
            usage = data.get("usage") or {}
            if usage.get("output_tokens") is not None:
                self._usage.output_tokens = int(usage["output_tokens"])
            if usage.get("input_tokens"):
                self._usage.input_tokens = int(usage["input_tokens"]) + self._usage.cached_input_tokens + int(
                    usage.get("cache_creation_input_tokens") or 0)
        elif kind == "message_stop":
            self.done = True
        return []

    def finish(self) -> ModelReply:
        calls = tuple(
            ToolCall(call_id=b["id"], name=b["name"], arguments_json="".join(b["json"]) or "{}")
            for _, b in sorted(self._blocks.items())
            if b["type"] == "tool_use"
        )
        return ModelReply(
            text="".join(self._text), tool_calls=calls, usage=self._usage, model=self.model,
            finish_reason=self.stop_reason or ("tool_use" if calls else "end_turn"),
            reasoning="".join(self._reasoning),
        )


class AnthropicProvider:
    name = "anthropic"

    def __init__(self, client: httpx.AsyncClient, base_url: str, api_key: str, retry: RetryPolicy):
        self.url = f"{base_url.rstrip('/')}/messages"
        self._api_key = api_key
        self._redact = Redactor(api_key)
        self._opener = HttpStreamOpener(client, retry, self._redact)

    def _headers(self) -> dict[str, str]:
        headers = {"anthropic-version": ANTHROPIC_VERSION, "Accept": "text/event-stream"}
        if self._api_key:
            headers["x-api-key"] = self._api_key
        return headers

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        response: httpx.Response | None = None
        async for item in self._opener.open(self.url, self._headers(), anthropic_body(request)):
            if isinstance(item, httpx.Response):
                response = item
            else:
                yield item
        assert response is not None
        assembler = AnthropicStreamAssembler()
        try:
            check_stream_type(response, self.url, json_ok=False)
            events = EventSource(response).aiter_sse()
            async for sse in events:
                if not sse.data.strip():
                    continue
                data = json.loads(sse.data)
                if sse.event == "error" or data.get("type") == "error":
                    detail = (data.get("error") or {}).get("message") or "unknown error"
                    raise Unavailable(f"the model server at {self.url} reported an error mid-answer: {self._redact(detail)}")
                for text in assembler.feed(sse.event, data):
                    yield text
                if assembler.done:
                    await drain(events)
                    break
        except (httpx.HTTPError, SSEError, json.JSONDecodeError) as exc:
            raise broken_stream_error(self.url, exc, self._redact) from None
        finally:
            await response.aclose()
        if not assembler.done:
            raise Unavailable(
                f"the model server at {self.url} ended its answer before message_stop; "
                "not retried because part of the answer had already arrived"
            )
        yield assembler.finish()
