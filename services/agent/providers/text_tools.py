"""Tool calls written in the reply's text, for weak local models without native function calling
(a catalogue model with `text_tool_calls: true`, agentmesh.models).

A wrapper around any provider. The request goes out without a `tools` field: the tools are
described in the system prompt instead, with the one format the model is asked to write a call
in, a JSON object between tags on its own:

    <tool_call>{"name": "shell", "arguments": {"command": "ls"}}</tool_call>

Earlier calls in the history are shown to the model in that same form, and their results come
back as user messages `<tool_result name="shell" call_id="...">...</tool_result>`, so a server
that knows nothing of tool roles accepts the conversation. The reply's text is parsed for the
blocks: each becomes a `ToolCall` (as if the model had called natively) and is removed from the
text. Text streams to the user as usual until a block starts; what follows is not streamed.
A block that is not a JSON object with a string `name` stays in the text, so the model's
mistake is visible rather than silently lost.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from typing import Any, AsyncIterator

from agentmesh.agent.providers.base import ModelProvider
from agentmesh.agent.types import ChatMessage, ModelEvent, ModelReply, ModelRequest, TextChunk, ToolCall, ToolSpec

__all__ = ["CLOSE", "OPEN", "TextToolCalls", "parse_tool_calls", "text_request"]

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*(?:" + re.escape(CLOSE) + r"|\Z)", re.DOTALL)

INSTRUCTION = """You can use tools. To call one, write a line of exactly this form, and nothing after it:
<tool_call>{{"name": "TOOL_NAME", "arguments": {{...}}}}</tool_call>
Write one such line per call (several calls may follow each other), then stop: the results come back as
<tool_result name="TOOL_NAME" call_id="...">...</tool_result>. Answer without a tool call when you are done.

Tools (name, what it does, its arguments as JSON Schema):
{tools}"""

NO_TOOLS_NOW = "Do not call any tool now; answer in plain text."


def _describe(tools: list[ToolSpec]) -> str:
    return "\n".join(f"- {t.name}: {t.description}\n  arguments: {json.dumps(t.parameters, separators=(',', ':'))}"
                     for t in tools)


def _call_text(call: ToolCall) -> str:
    try:
        arguments: Any = json.loads(call.arguments_json or "{}")
    except (ValueError, RecursionError):
        arguments = call.arguments_json
    return f"{OPEN}{json.dumps({'name': call.name, 'arguments': arguments})}{CLOSE}"


def text_request(request: ModelRequest) -> ModelRequest:
    """`request` as a model without function calling gets it: tools in the system prompt, calls
    and results in the messages' text, no `tools` field."""
    messages: list[ChatMessage] = []
    for m in request.messages:
        if m.role == "assistant" and m.tool_calls:
            text = "\n".join([m.content.rstrip(), *(_call_text(c) for c in m.tool_calls)]).strip()
            messages.append(dataclasses.replace(m, content=text, tool_calls=()))
        elif m.role == "tool":
            # A result's images go with it: a user message carries images in either API.
            messages.append(ChatMessage(role="user", run_id=m.run_id, images=m.images, content=(
                f'<tool_result name="{m.name}" call_id="{m.tool_call_id}">\n{m.content}\n</tool_result>')))
        else:
            messages.append(m)
    if request.tools:
        note = INSTRUCTION.format(tools=_describe(request.tools))
        if not request.allow_tools:
            note += "\n\n" + NO_TOOLS_NOW
        if messages and messages[0].role == "system":
            messages[0] = dataclasses.replace(messages[0], content=f"{messages[0].content}\n\n{note}")
        else:
            messages.insert(0, ChatMessage(role="system", content=note))
    return dataclasses.replace(request, messages=messages, tools=[])


def parse_tool_calls(text: str) -> tuple[str, tuple[ToolCall, ...]]:
    """The text without its tool-call blocks, and the calls they hold, in order."""
    calls: list[ToolCall] = []

    def take(match: re.Match[str]) -> str:
        try:
            data = json.loads(match.group(1))
        except ValueError:
            return match.group(0)
        if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
            return match.group(0)
        arguments = data.get("arguments", data.get("parameters", {}))
        arguments_json = arguments if isinstance(arguments, str) else json.dumps(arguments if arguments is not None else {})
        calls.append(ToolCall(call_id=f"call_{uuid.uuid4().hex[:12]}", name=data["name"], arguments_json=arguments_json))
        return ""

    remaining = _BLOCK.sub(take, text)
    return (remaining.strip() if calls else text), tuple(calls)


class TextToolCalls:
    """A provider whose model writes its tool calls as text (see the module's doc)."""

    def __init__(self, inner: ModelProvider):
        self.inner = inner
        self.name = inner.name

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        shown = 0  # characters of the text already streamed
        text = ""
        async for item in self.inner.stream(text_request(request)):
            if isinstance(item, TextChunk):
                text += item.text
                # Stream up to a block's start; hold back what could be the start of "<tool_call>".
                start = text.find(OPEN)
                safe = start
                if start < 0:
                    partial = text.rfind("<", max(len(text) - len(OPEN) + 1, 0))
                    safe = len(text) if partial < 0 or not OPEN.startswith(text[partial:]) else partial
                if safe > shown:
                    yield TextChunk(text[shown:safe])
                    shown = safe
            elif isinstance(item, ModelReply):
                remaining, calls = parse_tool_calls(item.text)
                if not calls:
                    if len(item.text) > shown:  # held back, but no call after all
                        yield TextChunk(item.text[shown:])
                    yield item
                    continue
                yield dataclasses.replace(item, text=remaining, tool_calls=item.tool_calls + calls,
                                          finish_reason="tool_calls")
            else:
                yield item
