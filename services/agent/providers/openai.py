"""OpenAI-compatible chat completions over httpx: OpenAI, Ollama, vLLM, LM Studio, llama.cpp,
OpenRouter — anything that serves `POST {base}/chat/completions` with SSE streaming.

SSE framing is parsed by `httpx-sse` (a small, maintained library that follows the
WHATWG event-stream rules: multi-line data, comments, CRLF); what the events mean is ours,
in `OpenAIStreamAssembler`, which the scripted provider reuses so that both produce the
same internal events.
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any, AsyncIterator, Callable, Hashable

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


def image_part(image: ImageRef) -> dict[str, Any]:
    """An image as OpenAI's `image_url` content part: a data URL of its bytes."""
    url = f"data:{image.media_type};base64,{base64.b64encode(image.data).decode('ascii')}"
    return {"type": "image_url", "image_url": {"url": url}}


def _with_images(text: str, images: tuple[ImageRef, ...]) -> list[dict[str, Any]]:
    return [*([{"type": "text", "text": text}] if text else []), *(image_part(i) for i in images)]


def tool_images_message(messages: list[ChatMessage]) -> dict[str, Any] | None:
    """The images of a group of tool results, as the user message that follows the group: the
    API takes only text in a tool message, and a tool message must follow its call at once."""
    parts: list[dict[str, Any]] = []
    for m in messages:
        if m.images:
            parts.append({"type": "text", "text": f"Images returned by {m.name or 'a tool'} ({m.tool_call_id}):"})
            parts.extend(image_part(i) for i in m.images)
    return {"role": "user", "content": parts} if parts else None


def to_openai_message(m: ChatMessage) -> dict[str, Any]:
    if m.role == "assistant" and m.tool_calls:
        return {
            "role": "assistant",
            # OpenAI wants null rather than "" beside tool calls; some local servers choke on "".
            "content": m.content or None,
            "tool_calls": [
                {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments_json or "{}"}}
                for c in m.tool_calls
            ],
        }
    if m.role == "tool":
        return {"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content}
    if m.images:
        return {"role": m.role, "content": _with_images(m.content, m.images)}
    return {"role": m.role, "content": m.content}


def _tool_groups(messages: list[ChatMessage]) -> list[tuple[ChatMessage | None, list[ChatMessage]]]:
    """Each message, with — after the last tool result of a run of them — that run's results
    (whose images follow it as a user message)."""
    out: list[tuple[ChatMessage | None, list[ChatMessage]]] = []
    run: list[ChatMessage] = []
    for m in messages:
        if m.role != "tool" and run:
            out.append((None, run))
            run = []
        out.append((m, []))
        if m.role == "tool":
            run.append(m)
    if run:
        out.append((None, run))
    return out


def to_openai_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m, run in _tool_groups(messages):
        if m is not None:
            out.append(to_openai_message(m))
        elif (images := tool_images_message(run)) is not None:
            out.append(images)
    return out


def to_openai_tool(tool: ToolSpec) -> dict[str, Any]:
    return {"type": "function", "function": {"name": tool.name, "description": tool.description,
                                             "parameters": tool.parameters}}


def to_openai_tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    return [to_openai_tool(t) for t in tools]


def _dumps(value: Any) -> str:
    # As httpx encodes `json=`: compact, UTF-8 as is, no NaN.
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


class Encoded:
    """The JSON of each message or tool spec sent, kept by the (frozen) object it encodes. A turn's
    calls send the same history messages and, while the catalog holds (tool_catalog.py), the same
    specs: ~9 KB of tool schemas and the earlier turns, encoded once instead of on every model call
    (~65 µs a call for the default catalog alone). Keyed by identity and holding the object itself,
    so an entry never answers for another object — or, given `key`, by what `key` says of it: all
    that its JSON depends on, so that an equal object answers too (a turn's history is made anew
    from the transcript every turn, and its messages are the last turn's). Emptied once it holds
    `max_items` objects or `max_chars` of JSON."""

    def __init__(self, to_json: Callable[[Any], dict[str, Any]], *, max_items: int, max_chars: int,
                 key: Callable[[Any], Hashable] | None = None):
        self._to_json = to_json
        self._key = key
        self._max_items = max_items
        self._max_chars = max_chars
        self._chars = 0
        self._by_key: dict[Hashable, tuple[Any, str]] = {}

    def __call__(self, item: Any) -> str:
        key = id(item) if self._key is None else self._key(item)
        kept = self._by_key.get(key)
        if kept is not None and (self._key is not None or kept[0] is item):
            return kept[1]
        encoded = _dumps(self._to_json(item))
        if len(self._by_key) >= self._max_items or self._chars + len(encoded) > self._max_chars:
            self._by_key.clear()
            self._chars = 0
        self._by_key[key] = (item, encoded)
        self._chars += len(encoded)
        return encoded


def message_key(m: ChatMessage) -> Hashable:
    """All that `to_openai_message` reads of a message without images (the encoder encodes one
    with images afresh): equal keys, equal JSON."""
    return m.role, m.content, m.tool_call_id, m.tool_calls


class OpenAIEncoder:
    """`openai_body(request)` as the JSON bytes sent, messages and tools from the caches above."""

    def __init__(self) -> None:
        # Enough for the history of a few dozen sessions' turns in flight at once.
        self._messages = Encoded(to_openai_message, max_items=4096, max_chars=4_000_000, key=message_key)
        self._tools = Encoded(to_openai_tool, max_items=1024, max_chars=1_000_000)

    def __call__(self, request: ModelRequest) -> bytes:
        rest = _dumps(openai_body(request, with_messages=False, with_tools=False))
        messages = ",".join(self._messages_json(request.messages))
        text = f'{{"messages":[{messages}],{rest[1:]}'
        if request.tools:
            tools = ",".join(self._tools(t) for t in request.tools)
            choice = "auto" if request.allow_tools else "none"
            text = f'{text[:-1]},"tools":[{tools}],"tool_choice":"{choice}"}}'
        return text.encode()

    def _messages_json(self, messages: list[ChatMessage]) -> list[str]:
        """As `to_openai_messages`, each message's JSON: one walk, no grouping built (every model
        call walks the whole history); the images of a run of tool results follow the run."""
        encoded: list[str] = []
        with_images: list[ChatMessage] = []  # of the current run of tool results
        in_run = False
        for m in messages:
            if m.role == "tool":
                in_run = True
                if m.images:
                    with_images.append(m)
            elif in_run:
                in_run = False
                if with_images:
                    encoded.append(_dumps(tool_images_message(with_images)))
                    with_images = []
            # A message with image bytes is encoded afresh: megabytes would flush the cache.
            encoded.append(_dumps(to_openai_message(m)) if m.images else self._messages(m))
        if with_images:
            encoded.append(_dumps(tool_images_message(with_images)))
        return encoded


def openai_body(request: ModelRequest, *, with_messages: bool = True, with_tools: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {"model": request.model}
    if with_messages:
        body["messages"] = to_openai_messages(request.messages)
    body.update({"stream": True, "stream_options": {"include_usage": True}})
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
        self._encode = OpenAIEncoder()

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "text/event-stream"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        response: httpx.Response | None = None
        async for item in self._opener.open(self.url, self._headers(), self._encode(request)):
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
