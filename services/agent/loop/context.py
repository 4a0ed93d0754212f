"""Context assembly: what the model sees on each call.

    [system prompt: instructions, capabilities' sections, date, tool guidance, recalled memories]
    + earlier turns from the transcript (repaired, trimmed to the budget)
    + this turn so far (user message, assistant replies, tool results)

Budget policy (characters, about four per token; simple and predictable by design):
1. Every tool output is cut to `tool_output_chars`, keeping its head and tail.
2. While the total is over `context_budget_chars`, the oldest earlier turn (a user message and
   everything up to the next one) is dropped whole, so a tool result never loses its call.
   The system prompt says how many messages were left out. A compaction summary at the head
   of the history (compaction.py) is never dropped: it is what stands in for older turns.
   Compaction normally keeps the history well under the budget; this is the last resort.
3. If this turn alone is still over budget, the outputs of its oldest tool results are replaced
   by a short placeholder, oldest first; the latest round always stays intact.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Iterable

from agentmesh.agent.loop.ports import MemoryHit
from agentmesh.agent.types import ChatMessage, ToolSpec

# A compaction summary stored in the transcript (compaction.py) has this kind.
SUMMARY_KIND = "summary"
INTERRUPTED = "error: no result was recorded for this call (the run was interrupted or cancelled)"
OMITTED_OUTPUT = "[output omitted to fit the context budget]"
MEMORY_CHARS = 1000
CONTINUE_INSTRUCTION = (
    "Your reply above was cut off by the output length limit. Continue it exactly where it stopped: no repetition, "
    "no preamble, no comment on the interruption."
)
SUMMARY_INSTRUCTION = (
    "You have used all {n} tool-using steps allowed for this turn. Do not call any tools. Reply to the user now "
    "with a short summary of what you did, what you found, and what is left to do."
)


def clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    return f"{text[:head]}\n[… {len(text) - limit} characters cut …]\n{text[-tail:]}"


def size_of(message: ChatMessage, tool_output_chars: int = 0) -> int:
    """`tool_output_chars`: the size a tool result will have once clipped to it (0: as it is)."""
    # An overhead per message and per call stands for the role, ids and formatting, about what
    # they take on the wire (JSON keys and ids), so that the characters-per-token ratio learned
    # from the server's counts holds for a request of many small messages as for one of few large.
    content = len(message.content)
    if tool_output_chars and message.role == "tool" and content > tool_output_chars:
        content = len(clip(message.content, tool_output_chars))
    calls = message.tool_calls
    if not calls:  # most messages: no generator to sum (every model call sizes the whole history)
        return 40 + content
    return 40 + content + sum(len(c.name) + len(c.arguments_json) + 80 for c in calls)


def system_prompt(
    base: str,
    *,
    now: dt.datetime,
    tools: Iterable[ToolSpec],
    memories: list[MemoryHit],
    omitted: int = 0,
    sections: Iterable[str] = (),
) -> str:
    """`sections`: what capabilities add (standing instructions, skills), right after `base`."""
    names = [t.name for t in tools]
    parts = [base.strip(), *(s.strip() for s in sections), f"Today is {now:%A, %d %B %Y}; the time is {now:%H:%M} UTC."]
    if names:
        parts.append(
            "You can call these tools: " + ", ".join(names) + ". "
            "File and shell tools work in this session's private, sandboxed workspace: use relative paths. "
            "Independent calls may go in one reply; they run at the same time. "
            "A failed call comes back as its result, marked as an error: read it and adjust instead of repeating it."
            + (
                " Use memory_save for durable facts worth keeping across sessions, and memory_search to look up "
                "what was saved before."
                if "memory_save" in names
                else ""
            )
        )
    if memories:
        lines = "\n".join(f"- [{m.kind or 'memory'}] {clip(m.text, MEMORY_CHARS)}" for m in memories)
        parts.append(f"From long-term memory (saved earlier; it may be out of date):\n{lines}")
    if omitted:
        parts.append(f"({omitted} earlier messages of this conversation are left out to fit the context budget.)")
    return "\n\n".join(p for p in parts if p)


def model_view(stored: list[ChatMessage], *, use_summaries: bool) -> list[ChatMessage]:
    """What the model sees of a stored transcript: the latest summary, then every message after
    the ones it covers. Without summaries (or compaction off) the summary entries are skipped
    and everything else is replayed, as before compaction existed.

    A store that assigns no seq (an in-process store) numbers messages by position, which is
    exactly what the memory service assigns."""
    numbered = [m if m.seq else replace(m, seq=i + 1) for i, m in enumerate(stored)]
    # Entries of other kinds (usage, …) are the agent's bookkeeping, never conversation.
    messages = [m for m in numbered if not m.kind]
    summaries = [m for m in numbered if m.kind == SUMMARY_KIND]
    if not use_summaries or not summaries:
        return messages
    latest = max(summaries, key=lambda m: (m.covers_through_seq, m.seq))
    return [latest, *(m for m in messages if m.seq > latest.covers_through_seq)]


def repair(history: list[ChatMessage]) -> list[ChatMessage]:
    """Make a stored transcript valid to replay: every assistant tool call followed by exactly one
    result (in call order; a placeholder when a crash or cancel lost it), no orphan results."""
    out: list[ChatMessage] = []
    i = 0
    while i < len(history):
        message = history[i]
        i += 1
        if message.role == "tool":
            continue  # a result whose call is not right before it: unusable
        out.append(message)
        if message.role != "assistant" or not message.tool_calls:
            continue
        results: dict[str, ChatMessage] = {}
        while i < len(history) and history[i].role == "tool":
            results.setdefault(history[i].tool_call_id, history[i])
            i += 1
        for call in message.tool_calls:
            found = results.get(call.call_id)
            out.append(found or ChatMessage(role="tool", content=INTERRUPTED, tool_call_id=call.call_id, name=call.name))
    return out


def whole_turns(history: list[ChatMessage]) -> list[list[ChatMessage]]:
    """The history cut before each user message: a turn holds its tool calls and their results."""
    turns: list[list[ChatMessage]] = []
    for message in history:
        if message.role == "user" or not turns:
            turns.append([])
        turns[-1].append(message)
    return turns


def fit(
    system: str,
    history: list[ChatMessage],
    current: list[ChatMessage],
    *,
    budget_chars: int,
    tool_output_chars: int,
) -> tuple[list[ChatMessage], list[ChatMessage], int]:
    """Apply the budget policy; returns (history kept, current turn, number of messages left out)."""
    kept, current, omitted, _ = fit_counted(system, history, current, budget_chars=budget_chars,
                                            tool_output_chars=tool_output_chars)
    return kept, current, omitted


def fit_counted(
    system: str,
    history: list[ChatMessage],
    current: list[ChatMessage],
    *,
    budget_chars: int,
    tool_output_chars: int,
) -> tuple[list[ChatMessage], list[ChatMessage], int, int]:
    """`fit`, and the size (`size_of`) of the messages it keeps plus `len(system)`: what the
    policy already summed, so that a model call walks its history once rather than twice."""

    def clipped(messages: list[ChatMessage]) -> list[ChatMessage]:
        # A copy only of the results that are cut: most fit, and the history is walked every call.
        return [replace(m, content=clip(m.content, tool_output_chars))
                if m.role == "tool" and len(m.content) > tool_output_chars else m for m in messages]

    pinned = history[:1] if history and history[0].kind == SUMMARY_KIND else []
    kept = clipped(history[len(pinned):])  # clipping keeps every role: the same whole turns
    current = clipped(current)
    total = len(system) + sum(map(size_of, pinned)) + sum(map(size_of, kept)) + sum(map(size_of, current))
    omitted = 0
    if total > budget_chars and kept:  # cut into turns only when some must go (the oldest first)
        turns = whole_turns(kept)
        dropping = 0
        while dropping < len(turns) and total > budget_chars:
            omitted += len(turns[dropping])
            total -= sum(map(size_of, turns[dropping]))
            dropping += 1
        kept = [m for t in turns[dropping:] for m in t]
    if total > budget_chars:
        last_round = max((i for i, m in enumerate(current) if m.role == "assistant"), default=len(current))
        for i, m in enumerate(current[:last_round]):
            if total <= budget_chars:
                break
            if m.role == "tool" and m.content != OMITTED_OUTPUT:
                total -= len(m.content) - len(OMITTED_OUTPUT)
                current[i] = replace(m, content=OMITTED_OUTPUT)
    return [*pinned, *kept], current, omitted, total
