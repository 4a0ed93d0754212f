"""Reasoning that models emit beside their answer, split from it while it streams.

Two shapes reach us: a separate field on each delta (`reasoning_content` from DeepSeek, vLLM and
llama.cpp; `reasoning` from OpenRouter and Ollama), and `<think>…</think>` inside the content
(Qwen, DeepSeek-R1 distills and others served raw). `ThinkSplitter` handles the second: it cuts
content into answer and reasoning pieces as chunks arrive, holding back only what could be the
start of a tag split over two chunks.
"""

from __future__ import annotations

from agentmesh.agent.types import ReasoningChunk, TextChunk

OPEN, CLOSE = "<think>", "</think>"


def _partial_tag_at_end(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper beginning of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ThinkSplitter:
    def __init__(self) -> None:
        self._held = ""
        self._thinking = False
        self._after_close = False  # the answer after a think block starts without its blank lines

    def feed(self, text: str) -> list[TextChunk | ReasoningChunk]:
        out: list[TextChunk | ReasoningChunk] = []
        held = self._held + text
        while held:
            tag = CLOSE if self._thinking else OPEN
            at = held.find(tag)
            if at < 0:
                keep = _partial_tag_at_end(held, tag)
                self._emit(out, held[: len(held) - keep])
                held = held[len(held) - keep:]
                break
            self._emit(out, held[:at])
            held = held[at + len(tag):]
            self._thinking = not self._thinking
            self._after_close = not self._thinking
        self._held = held
        return out

    def flush(self) -> list[TextChunk | ReasoningChunk]:
        out: list[TextChunk | ReasoningChunk] = []
        self._emit(out, self._held)
        self._held = ""
        return out

    def _emit(self, out: list[TextChunk | ReasoningChunk], piece: str) -> None:
        if self._thinking:
            if piece:
                out.append(ReasoningChunk(piece))
            return
        if self._after_close:
            piece = piece.lstrip("\n")
            if piece:
                self._after_close = False
        if piece:
            out.append(TextChunk(piece))
