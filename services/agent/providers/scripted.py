"""A provider that replays a scripted conversation — the offline model of `agentmesh demo`.

Script (JSON file named by AGENTMESH_LLM_SCRIPT; without one, `DEMO_SCRIPT` below):

    {"turns": [
        {"match": "notes.txt",                       # optional, case-insensitive substring
         "replies": [                                # one per model call in the turn
            {"text": "Writing it.", "tool_calls": [{"name": "write_file",
                                                    "arguments": {"path": "a.txt", "content": "hi"}}]},
            {"text": "Done."}
         ]}
    ]}

A bare list of replies is accepted as one turn that matches everything. The provider keeps no
state (any agent replica may serve any call): the turn is the first whose `match` occurs in the
latest user message (a turn without `match` matches all), and the reply is the N-th, where N is
the number of assistant messages since that user message. When the loop asks for a tool-less
summary, a reply's tool calls are dropped. Replies are streamed as OpenAI-style chunks through
the same assembler as the real provider, so text arrives as deltas and tool arguments in pieces.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any, AsyncIterator

from agentmesh.agent.providers.openai import OpenAIStreamAssembler
from agentmesh.agent.types import ModelEvent, ModelRequest
from agentmesh.config import ConfigError

TEXT_CHUNK_CHARS = 12
ARGUMENT_CHUNK_CHARS = 16

DEMO_NOTE = "agentmesh runs tool-using LLM agents as gRPC services; every tool call runs in a sandbox.\n"

DEMO_SCRIPT: dict[str, Any] = {
    "turns": [
        {
            "replies": [
                {
                    "text": "I'll write the note to notes.txt in the workspace first.",
                    "tool_calls": [{"name": "write_file", "arguments": {"path": "notes.txt", "content": DEMO_NOTE}}],
                },
                {
                    "text": "Now I'll read it back, once with read_file and once with cat in the shell.",
                    "tool_calls": [
                        {"name": "read_file", "arguments": {"path": "notes.txt"}},
                        {"name": "shell", "arguments": {"command": "cat notes.txt && wc -c notes.txt"}},
                    ],
                },
                {
                    "text": "The note reads back intact. I'll remember that it exists.",
                    "tool_calls": [
                        {
                            "name": "memory_save",
                            "arguments": {
                                "text": "The workspace holds notes.txt, a short note about what agentmesh is.",
                                "kind": "fact",
                            },
                        }
                    ],
                },
                {
                    "text": "Let me check that my memory finds it.",
                    "tool_calls": [{"name": "memory_search", "arguments": {"query": "note about agentmesh", "k": 3}}],
                },
                {
                    "text": (
                        "Done. I wrote notes.txt with a one-line note about agentmesh, read it back with read_file "
                        "and with `cat` in the sandboxed shell, saved a memory that the note exists, and found "
                        "that memory again with memory_search."
                    )
                },
            ]
        }
    ]
}


def load_script(path: str) -> dict[str, Any]:
    """The script at `path`, or the built-in demo; raises ConfigError naming the problem."""
    if not path:
        return DEMO_SCRIPT
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"AGENTMESH_LLM_SCRIPT: cannot read {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"AGENTMESH_LLM_SCRIPT: {path} is not valid JSON ({exc.msg}, line {exc.lineno})") from None
    if isinstance(data, list):
        data = {"turns": [{"replies": data}]}
    if not isinstance(data, dict) or not isinstance(data.get("turns"), list):
        raise ConfigError(f"AGENTMESH_LLM_SCRIPT: {path} must hold {{\"turns\": [...]}} or a list of replies")
    for i, turn in enumerate(data["turns"]):
        if not isinstance(turn, dict) or not isinstance(turn.get("replies"), list):
            raise ConfigError(f"AGENTMESH_LLM_SCRIPT: turn {i} needs a list of replies")
    return data


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


class ScriptedProvider:
    name = "scripted"

    def __init__(self, script: dict[str, Any], delay_s: float = 0.0):
        self._script = script
        self._delay_s = delay_s

    def _pick_reply(self, request: ModelRequest) -> dict[str, Any]:
        last_user = max((i for i, m in enumerate(request.messages) if m.role == "user"), default=-1)
        user_text = request.messages[last_user].content.lower() if last_user >= 0 else ""
        step = sum(1 for m in request.messages[last_user + 1 :] if m.role == "assistant")
        for turn in self._script["turns"]:
            match = str(turn.get("match") or "").lower()
            if match in user_text:
                replies = turn["replies"]
                if step < len(replies):
                    return dict(replies[step])
                break
        return {"text": "(the script has no more replies for this turn)"}

    def _chunks(self, request: ModelRequest, reply: dict[str, Any]) -> list[dict[str, Any]]:
        text = str(reply.get("text") or "")
        calls = list(reply.get("tool_calls") or []) if request.allow_tools else []
        if not request.allow_tools and not text:
            text = "I reached the step limit for this turn; the steps so far are in the transcript."
        chunks: list[dict[str, Any]] = []

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {"model": request.model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        if text:
            chunks += [chunk({"content": piece}) for piece in _pieces(text, TEXT_CHUNK_CHARS)]
        for index, call in enumerate(calls):
            arguments = call.get("arguments", {})
            arguments = arguments if isinstance(arguments, str) else json.dumps(arguments)
            call_id = call.get("id") or f"call_{uuid.uuid4().hex[:12]}"
            head = {"index": index, "id": call_id, "type": "function", "function": {"name": call["name"], "arguments": ""}}
            chunks.append(chunk({"tool_calls": [head]}))
            chunks += [
                chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
                for piece in _pieces(arguments, ARGUMENT_CHUNK_CHARS)
            ]
        chunks.append(chunk({}, "tool_calls" if calls else "stop"))
        usage = reply.get("usage") or {
            # A rough, deterministic count so usage totals mean something offline.
            "prompt_tokens": sum(len(m.content) for m in request.messages) // 4 + 1,
            "completion_tokens": (len(text) + sum(len(json.dumps(c)) for c in calls)) // 4 + 1,
        }
        chunks.append({"model": request.model, "choices": [], "usage": usage})
        return chunks

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        reply = self._pick_reply(request)
        assembler = OpenAIStreamAssembler()
        delay = float(reply.get("delay_s", self._delay_s))
        for chunk in self._chunks(request, reply):
            # Yield to the loop between chunks, as a network stream would; a delay makes the
            # stream observable (and cancellable) mid-answer.
            await asyncio.sleep(delay)
            for text in assembler.feed(chunk):
                yield text
        yield assembler.finish()
