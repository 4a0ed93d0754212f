"""What the scripted model server (llm_server.py) sends, in each API's wire format: the OpenAI
chat completion (streamed as `chat.completion.chunk` SSE events, or as one JSON object), the
Anthropic Messages event stream, and the tool-call pairing an OpenAI-compatible server insists on.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from tests.support.llm_server import Reply

__all__ = ["anthropic_events", "openai_completion", "openai_events", "pieces", "protocol_errors"]


def protocol_errors(messages: Sequence[dict[str, Any]]) -> list[str]:
    """What an OpenAI-compatible server would refuse in a chat's messages (tool-call pairing)."""
    errors: list[str] = []
    open_calls: set[str] = set()
    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in open_calls:
                errors.append(f"messages[{index}]: tool message {call_id!r} answers no tool call of the assistant message before it")
            open_calls.discard(call_id)
            continue
        if open_calls:
            errors.append(f"messages[{index}]: an assistant message with 'tool_calls' must be followed by tool "
                          f"messages responding to each 'tool_call_id'; missing {sorted(open_calls)}")
            open_calls = set()
        if role == "assistant":
            open_calls = {c.get("id") for c in message.get("tool_calls") or []}
    if open_calls:
        errors.append(f"messages end with tool calls that have no tool message: {sorted(open_calls)}")
    return errors


def pieces(text: str, size: int) -> list[str]:
    """`text` in pieces of `size` characters: how the reply streams."""
    size = max(1, size)
    return [text[i : i + size] for i in range(0, len(text), size)]


def openai_events(step: Reply, model: str, include_usage: bool) -> list[bytes]:
    """The SSE events of a streamed chat completion; the usage chunk only when the client asked."""
    cid = f"chatcmpl-{uuid.uuid4().hex[:12]}"

    def chunk(delta: dict[str, Any], finish: str | None = None, usage: Any = None, choices: bool = True) -> bytes:
        payload: dict[str, Any] = {
            "id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}] if choices else [],
        }
        if usage is not None:
            payload["usage"] = usage
        return b"data: " + json.dumps(payload).encode() + b"\n\n"

    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"reasoning_content": piece}) for piece in pieces(step.reasoning, step.chunk_chars)]
    out += [chunk({"content": piece}) for piece in pieces(step.text, step.chunk_chars)]
    per_call: list[list[bytes]] = []
    for index, call in enumerate(step.tool_calls):
        call_id = call.id or f"call_{uuid.uuid4().hex[:10]}"
        head = {"index": index, "id": call_id, "type": "function",
                "function": {"name": call.name, "arguments": ""}}
        parts = [chunk({"tool_calls": [head]})]
        parts += [chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
                  for piece in pieces(call.arguments_json, step.chunk_chars)]
        per_call.append(parts)
    if step.interleave:
        longest = max((len(p) for p in per_call), default=0)
        out += [p[i] for i in range(longest) for p in per_call if i < len(p)]
    else:
        out += [c for p in per_call for c in p]
    out.append(chunk({}, step.finish_reason or ("tool_calls" if step.tool_calls else "stop")))
    if include_usage:
        prompt, completion = step.usage
        usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        if step.cached_tokens:
            usage["prompt_tokens_details"] = {"cached_tokens": step.cached_tokens}
        out.append(chunk({}, usage=usage, choices=False))
    out.append(b"data: [DONE]\n\n")
    return out

def openai_completion(step: Reply, model: str) -> dict[str, Any]:
    """A chat completion in one JSON object (a request without `stream`, or `as_json`)."""
    message: dict[str, Any] = {"role": "assistant", "content": step.text or None}
    if step.tool_calls:
        message["tool_calls"] = [
            {"id": c.id or f"call_{uuid.uuid4().hex[:10]}", "type": "function",
             "function": {"name": c.name, "arguments": c.arguments_json}}
            for c in step.tool_calls
        ]
    prompt, completion = step.usage
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion", "model": model,
        "choices": [{"index": 0, "message": message,
                     "finish_reason": step.finish_reason or ("tool_calls" if step.tool_calls else "stop")}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }


def anthropic_events(step: Reply, model: str) -> list[bytes]:
    """The Messages API's event stream: text first, then each tool_use block."""
    def event(name: str, payload: dict[str, Any]) -> bytes:
        return f"event: {name}\ndata: {json.dumps(payload)}\n\n".encode()

    prompt, completion = step.usage
    out = [
        event("message_start", {"type": "message_start", "message": {
            "id": f"msg_{uuid.uuid4().hex[:12]}", "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": None, "usage": {
                "input_tokens": prompt - step.cached_tokens, "output_tokens": 1,
                "cache_read_input_tokens": step.cached_tokens}}}),
        event("ping", {"type": "ping"}),
    ]
    index = 0
    if step.text:
        out.append(event("content_block_start", {"type": "content_block_start", "index": index,
                                                 "content_block": {"type": "text", "text": ""}}))
        out += [event("content_block_delta", {"type": "content_block_delta", "index": index,
                                              "delta": {"type": "text_delta", "text": piece}})
                for piece in pieces(step.text, step.chunk_chars)]
        out.append(event("content_block_stop", {"type": "content_block_stop", "index": index}))
        index += 1
    for call in step.tool_calls:
        out.append(event("content_block_start", {"type": "content_block_start", "index": index, "content_block": {
            "type": "tool_use", "id": call.id or f"toolu_{uuid.uuid4().hex[:10]}", "name": call.name, "input": {}}}))
        out += [event("content_block_delta", {"type": "content_block_delta", "index": index,
                                              "delta": {"type": "input_json_delta", "partial_json": piece}})
                for piece in pieces(call.arguments_json, step.chunk_chars)]
        out.append(event("content_block_stop", {"type": "content_block_stop", "index": index}))
        index += 1
    out.append(event("message_delta", {"type": "message_delta",
                                       "delta": {"stop_reason": step.finish_reason or (
                                           "tool_use" if step.tool_calls else "end_turn"),
                                                 "stop_sequence": None},
                                       "usage": {"output_tokens": completion}}))
    out.append(event("message_stop", {"type": "message_stop"}))
    return out
