"""OpenAI-compatible chat completions over httpx: OpenAI, Ollama, vLLM, LM Studio, llama.cpp,
OpenRouter — anything that serves `POST {base}/chat/completions` with SSE streaming.

SSE framing is parsed by `httpx-sse` (a small, maintained library that follows the
WHATWG event-stream rules: multi-line data, comments, CRLF); what the events mean is ours,
in `OpenAIStreamAssembler`, which the scripted provider reuses so that both produce the
same internal events.
"""

from __future__ import annotations

import json
import uuid
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
from agentmesh.agent.providers.reasoning import ThinkSplitter
from agentmesh.agent.types import (
    ChatMessage,
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


def to_openai_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "assistant" and m.tool_calls:
            out.append(
                {
                    "role": "assistant",
                    # OpenAI wants null rather than "" beside tool calls; some local servers choke on "".
                    "content": m.content or None,
                    "tool_calls": [
                        {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments_json or "{}"}}
                        for c in m.tool_calls
                    ],
                }
            )
        elif m.role == "tool":
            out.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content})
        else:
            out.append({"role": m.role, "content": m.content})
    return out


def to_openai_tool(tool: ToolSpec) -> dict[str, Any]:
    return {"type": "function", "function": {"name": tool.name, "description": tool.description,
                                             "parameters": tool.parameters}}


def to_openai_tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    return [to_openai_tool(t) for t in tools]


def _dumps(value: Any) -> str:
    # As httpx encodes `json=`: compact, UTF-8 as is, no NaN.
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


class EncodedTools:
    """Each tool's JSON, kept by the ToolSpec object it encodes. The tool catalog is kept between
    turns (tool_catalog.py) and every call of a turn offers the same spec objects, so the schemas
    (~9 KB for the default catalog) are encoded once rather than on every model call (~65 µs a
    call). Keyed by identity, holding the (frozen) spec itself, so an entry never answers for
    another object; cleared when full."""

    LIMIT = 1024

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[ToolSpec, str]] = {}

    def __call__(self, tool: ToolSpec) -> str:
        kept = self._by_id.get(id(tool))
        if kept is not None and kept[0] is tool:
            return kept[1]
        if len(self._by_id) >= self.LIMIT:
            self._by_id.clear()
        encoded = _dumps(to_openai_tool(tool))
        self._by_id[id(tool)] = (tool, encoded)
        return encoded


def openai_payload(request: ModelRequest, encoded_tools: EncodedTools) -> bytes:
    """`openai_body(request)` as the JSON bytes sent, with the tools' part from `encoded_tools`."""
    text = _dumps(openai_body(request, with_tools=False))
    if request.tools:
        tools = ",".join(encoded_tools(t) for t in request.tools)
        choice = "auto" if request.allow_tools else "none"
        text = f'{text[:-1]},"tools":[{tools}],"tool_choice":"{choice}"}}'
    return text.encode()


def openai_body(request: ModelRequest, *, with_tools: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": request.model,
        "messages": to_openai_messages(request.messages),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.tools and with_tools:
        body["tools"] = to_openai_tools(request.tools)
        body["tool_choice"] = "auto" if request.allow_tools else "none"
    if request.max_tokens:
        body["max_tokens"] = request.max_tokens
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.top_p is not None:
        body["top_p"] = request.top_p
    return body


class OpenAIStreamAssembler:
    """Folds chat.completion.chunk objects into text deltas and one final `ModelReply`.

    Tool calls arrive as fragments keyed by `index`: the first carries id and name, the
    rest carry pieces of the `arguments` JSON text, in order. Several calls interleave freely.
    """

    def __init__(self) -> None:
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._think = ThinkSplitter()
        self._calls: dict[int, dict[str, Any]] = {}
        self._usage = Usage()
        self.model = ""
        self.finish_reason = ""
        self.done = False

    def feed(self, chunk: dict[str, Any]) -> list[TextChunk | ReasoningChunk]:
        out: list[TextChunk | ReasoningChunk] = []
        self.model = chunk.get("model") or self.model
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            details = usage.get("prompt_tokens_details") or {}
            cached = details.get("cached_tokens") if isinstance(details, dict) else 0
            self._usage = Usage(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0),
                                int(cached or 0))
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or choice.get("message") or {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                out.append(ReasoningChunk(reasoning))
            content = delta.get("content")
            if isinstance(content, str) and content:
                out.extend(self._think.feed(content))
            for position, fragment in enumerate(delta.get("tool_calls") or []):
                self._feed_call(fragment, position)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
                out.extend(self._think.flush())
        return self._keep(out)

    def _keep(self, pieces: list[TextChunk | ReasoningChunk]) -> list[TextChunk | ReasoningChunk]:
        for piece in pieces:
            (self._reasoning if isinstance(piece, ReasoningChunk) else self._text).append(piece.text)
        return pieces

    def _feed_call(self, fragment: dict[str, Any], position: int) -> None:
        index = fragment.get("index", position)
        slot = self._calls.setdefault(index, {"id": "", "name": "", "arguments": []})
        if fragment.get("id"):
            slot["id"] = fragment["id"]
        function = fragment.get("function") or {}
        if function.get("name") and not slot["name"]:
            slot["name"] = function["name"]
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            slot["arguments"].append(arguments)
        elif isinstance(arguments, dict):  # Ollama sends an object, not JSON text
            slot["arguments"].append(json.dumps(arguments))

    def finish(self) -> ModelReply:
        self._keep(self._think.flush())
        calls: list[ToolCall] = []
        seen: set[str] = set()
        for _, slot in sorted(self._calls.items()):
            call_id = slot["id"]
            if not call_id or call_id in seen:
                # Some local servers omit ids or repeat "call_0"; results are matched by id.
                call_id = f"call_{uuid.uuid4().hex[:12]}"
            seen.add(call_id)
            calls.append(ToolCall(call_id=call_id, name=slot["name"], arguments_json="".join(slot["arguments"]) or "{}"))
        return ModelReply(
            text="".join(self._text),
            tool_calls=tuple(calls),
            usage=self._usage,
            model=self.model,
            finish_reason=self.finish_reason or ("tool_calls" if calls else "stop"),
            reasoning="".join(self._reasoning),
        )


class OpenAIProvider:
    name = "openai"

    def __init__(self, client: httpx.AsyncClient, base_url: str, api_key: str, retry: RetryPolicy):
        self.url = f"{base_url.rstrip('/')}/chat/completions"
        self._api_key = api_key
        self._redact = Redactor(api_key)
        self._opener = HttpStreamOpener(client, retry, self._redact)
        self._encoded_tools = EncodedTools()

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "text/event-stream"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        response: httpx.Response | None = None
        async for item in self._opener.open(self.url, self._headers(), openai_payload(request, self._encoded_tools)):
            if isinstance(item, httpx.Response):
                response = item
            else:
                yield item
        assert response is not None
        assembler = OpenAIStreamAssembler()
        try:
            check_stream_type(response, self.url, json_ok=True)
            if "json" in response.headers.get("content-type", ""):
                # A server that ignored stream=true and sent one completion object.
                for chunk in assembler.feed(json.loads(await response.aread())):
                    yield chunk
                assembler.done = True
            else:
                events = EventSource(response).aiter_sse()
                async for sse in events:
                    data = sse.data.strip()
                    if not data:
                        continue
                    if data == "[DONE]":
                        assembler.done = True
                        await drain(events)
                        break
                    chunk = json.loads(data)
                    if isinstance(chunk, dict) and chunk.get("error"):
                        raise Unavailable(f"the model server at {self.url} reported an error mid-answer: "
                                          f"{self._redact(str(chunk['error'])[:300])}")
                    for text in assembler.feed(chunk):
                        yield text
        except (httpx.HTTPError, SSEError, json.JSONDecodeError) as exc:
            raise broken_stream_error(self.url, exc, self._redact) from None
        finally:
            await response.aclose()
        if not assembler.done and not assembler.finish_reason:
            raise Unavailable(
                f"the model server at {self.url} ended its answer early (no finish_reason and no [DONE]); "
                "not retried because part of the answer had already arrived"
            )
        yield assembler.finish()
