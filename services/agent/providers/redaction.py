"""The configured model keys, masked in what a model says.

Error bodies were already redacted (base.Redactor), but a model can say the key itself — a
prompt injection asking it to repeat its configuration, a proxy that echoes headers into the
completion — and what it says is streamed to the user, saved in the transcript, handed to tools
as arguments and logged. `KeyRedacting` masks every configured model key (each catalogue
model's and the default's: a model could be told another's) in the reply's text, reasoning and
tool-call arguments before any of that happens.

Streamed text is masked across chunk boundaries: the tail of a chunk that could be the start of
a key is held back until the next chunk shows whether it is, so no delta ever carries a part of
a key. What is streamed, joined, is what the reply holds.
"""

from __future__ import annotations

import dataclasses
from typing import AsyncIterator, Iterable

from agentmesh.agent.providers.base import ModelProvider, closing
from agentmesh.agent.types import ModelEvent, ModelReply, ModelRequest, ReasoningChunk, TextChunk

__all__ = ["MASK", "KeyRedacting", "StreamMask", "keys_worth_masking"]

MASK = "[redacted]"
# Shorter "keys" (a placeholder such as "x" for a local server that wants none) would mask
# ordinary text; base.Redactor draws the same line.
MIN_KEY_CHARS = 4


def keys_worth_masking(keys: Iterable[str]) -> tuple[str, ...]:
    """The distinct keys long enough to mask, longest first (a key inside another is masked whole)."""
    return tuple(sorted({k for k in keys if len(k) >= MIN_KEY_CHARS}, key=len, reverse=True))


def mask(text: str, keys: tuple[str, ...]) -> str:
    for key in keys:
        if key in text:
            text = text.replace(key, MASK)
    return text


class StreamMask:
    """Masks keys in a text that arrives in pieces: `feed` returns what can be shown now,
    `flush` the rest once the text is complete."""

    def __init__(self, keys: tuple[str, ...]):
        self._keys = keys
        self._held = ""

    def feed(self, piece: str) -> str:
        text = mask(self._held + piece, self._keys)
        keep = self._tail_that_may_start_a_key(text)
        self._held = text[len(text) - keep:] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held

    def _tail_that_may_start_a_key(self, text: str) -> int:
        """The length of the longest end of `text` that is a key's beginning (not a whole key)."""
        longest = 0
        for key in self._keys:
            window = text[-(len(key) - 1):]
            # Candidates start where the key's first character does; the first that fits is the longest.
            at = window.find(key[0])
            while at != -1 and len(window) - at > longest:
                if key.startswith(window[at:]):
                    longest = len(window) - at
                    break
                at = window.find(key[0], at + 1)
        return longest


class KeyRedacting:
    """`inner` with `keys` masked in everything its replies say."""

    def __init__(self, inner: ModelProvider, keys: tuple[str, ...]):
        self.inner = inner
        self.keys = keys
        self.name = inner.name

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        text, reasoning = StreamMask(self.keys), StreamMask(self.keys)
        async with closing(self.inner.stream(request)) as events:
            async for event in events:
                if isinstance(event, TextChunk):
                    shown = text.feed(event.text)
                    if shown:
                        yield TextChunk(shown)
                elif isinstance(event, ReasoningChunk):
                    shown = reasoning.feed(event.text)
                    if shown:
                        yield ReasoningChunk(shown)
                elif isinstance(event, ModelReply):
                    if rest := reasoning.flush():
                        yield ReasoningChunk(rest)
                    if rest := text.flush():
                        yield TextChunk(rest)
                    yield self._masked(event)
                else:
                    yield event

    def _masked(self, reply: ModelReply) -> ModelReply:
        keys = self.keys
        calls = tuple(
            dataclasses.replace(c, arguments_json=mask(c.arguments_json, keys), name=mask(c.name, keys))
            if any(k in c.arguments_json or k in c.name for k in keys) else c
            for c in reply.tool_calls
        )
        return dataclasses.replace(reply, text=mask(reply.text, keys), reasoning=mask(reply.reasoning, keys),
                                   tool_calls=calls)
