"""Compaction: when a session's history grows past a threshold, the model summarises its oldest
turns, and the summary stands in for them from then on.

Policy (characters, like the budget in context.py):
- **When**: at the start of a turn, if the history the model would see (tool outputs already
  cut to `tool_output_chars`) is over `compaction_threshold_chars` — `COMPACT_AT_CHARS`, or 3/4
  of `CONTEXT_BUDGET_CHARS`.
- **What**: the oldest whole turns (a user message and everything up to the next one), so a tool
  call never loses its result; the newest turns that fit in `compaction_keep_chars` stay
  verbatim. An earlier summary is folded into the new one.
- **How**: a tool-less model call with its own instruction, under a `compact_context` span whose
  `chat {model}` children carry `agentmesh.compaction=true`; its tokens count in the turn's usage.
  An old part too big for one call is summarised in passes, each folding in the last.
- **Durability**: the summary is appended to the transcript as a `role: system` message with
  `kind: "summary"` and `covers_through_seq` (the last stored message it replaces). `model_view`
  (context.py) turns a stored transcript into [latest summary] + messages after it covers, so the next turn
  reuses it. The transcript keeps every message; compaction only changes what the model sees.
- **Failure**: a summary call that fails (after the provider's retries) leaves the history as
  it was — `context.fit` then drops the oldest turns as before — with a status note. Compaction
  never fails a turn; cancellation passes through like anywhere else in the turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from opentelemetry.trace import SpanKind, Status, StatusCode

from agentmesh.agent.loop import context
from agentmesh.agent.loop.context import SUMMARY_KIND
from agentmesh.agent.loop.model_call import traced_model_call
from agentmesh.agent.loop.turn import Capability
from agentmesh.agent.loop.usage_log import UsageTag
from agentmesh.agent.types import ChatMessage, ModelReply, ModelRequest, RunEvent, StatusEvent, Usage
from agentmesh.errors import AgentmeshError, Unavailable
from agentmesh.logs import get_logger

if TYPE_CHECKING:  # only type names: the loop runs this capability, never imports it
    from agentmesh.agent.loop.run import Agent
    from agentmesh.agent.loop.turn_request import TurnRequest
    from agentmesh.agent.settings import AgentSettings

log = get_logger("agentmesh.agent.compaction")

SUMMARY_HEADER = (
    "Summary of this conversation up to message {n} (compacted to fit the context; the transcript keeps every "
    "message):"
)
INSTRUCTION = (
    "You compact a conversation between a user and an AI assistant that uses tools, so that the assistant can "
    "carry on without the original messages. Write a concise summary, in the conversation's language, with "
    "these parts:\n"
    "- Goal: what the user wants, including constraints and preferences they stated.\n"
    "- Decisions: what was decided or agreed, and why.\n"
    "- Facts: results, names, numbers, errors and findings worth remembering, exactly as found.\n"
    "- Files and resources: paths, commands, URLs touched, and their state.\n"
    "- Open items: what is unfinished or was promised next.\n"
    "Fold the earlier summary, if there is one, into yours: keep what still matters, drop what is settled. "
    "Do not call tools, do not address the user, do not invent anything. Plain text, no preamble."
)
# Each message's share of the summariser's input: enough to see what happened, not every byte.
MESSAGE_CHARS = 4000
TOOL_OUTPUT_CHARS = 2000
# A history far over the threshold is summarised in at most this many passes; older parts
# beyond that are left out of the summary (and said to be).
MAX_PASSES = 4

Emit = Callable[[RunEvent], None]


@dataclass(frozen=True)
class Plan:
    """What one compaction replaces and what stays."""

    earlier: ChatMessage | None  # the summary at the head of the history, folded into the new one
    old: list[ChatMessage]  # the oldest whole turns, to be summarised
    kept: list[ChatMessage]  # the newest whole turns, kept verbatim
    covers_through_seq: int
    chars_before: int


def plan(history: list[ChatMessage], *, threshold_chars: int, keep_chars: int, tool_output_chars: int) -> Plan | None:
    """None when the history is under the threshold or holds nothing to compact."""

    def size(m: ChatMessage) -> int:
        return context.size_of(m, tool_output_chars)

    total = sum(size(m) for m in history)
    if total <= threshold_chars:
        return None
    earlier = history[0] if history and history[0].kind == SUMMARY_KIND else None
    turns = context.whole_turns(history[1:] if earlier else history)
    kept_turns: list[list[ChatMessage]] = []
    kept_size = 0
    for turn in reversed(turns):
        turn_size = sum(size(m) for m in turn)
        if kept_size + turn_size > keep_chars:
            break
        kept_turns.insert(0, turn)
        kept_size += turn_size
    old = [m for turn in turns[: len(turns) - len(kept_turns)] for m in turn]
    seqs = [m.seq for m in old if m.seq]
    if not old or not seqs:
        return None  # only kept turns (or nothing stored yet): the budget policy handles it
    kept = [m for turn in kept_turns for m in turn]
    return Plan(earlier=earlier, old=old, kept=kept, covers_through_seq=max(seqs), chars_before=total)


def render(m: ChatMessage) -> str:
    """One message as plain text for the summariser (no tool-call structure to keep valid)."""
    # The summariser reads text: an image is said in a line ("[image: shot.png, 6×5 PNG]"), so the
    # summary can mention what was shown instead of silently losing it.
    images = "".join(f"\n{image.described()}" for image in m.images)
    if m.role == "tool":
        return f"[tool result {m.name or m.tool_call_id}]\n{context.clip(m.content, TOOL_OUTPUT_CHARS)}{images}"
    text = context.clip(m.content, MESSAGE_CHARS) + images
    calls = "".join(
        f"\n[tool call {c.name} {context.clip(c.arguments_json, TOOL_OUTPUT_CHARS)}]" for c in m.tool_calls
    )
    return f"[{m.role}]\n{text}{calls}".rstrip()


def passes(old: list[ChatMessage], limit_chars: int, first_limit_chars: int = 0) -> tuple[list[list[str]], int]:
    """The old messages rendered and grouped into passes of at most `limit_chars` each (the first
    may take `first_limit_chars` when larger; a single message larger than the limit is cut);
    returns (passes, number of messages left out)."""
    groups: list[list[str]] = [[]]
    used = 0
    for m in old:
        limit = max(first_limit_chars, limit_chars) if len(groups) == 1 else limit_chars
        text = context.clip(render(m), limit_chars)
        if groups[-1] and used + len(text) > limit:
            groups.append([])
            used = 0
        groups[-1].append(text)
        used += len(text) + 2
    left_out = sum(len(g) for g in groups[:-MAX_PASSES])
    return groups[-MAX_PASSES:], left_out


def summary_request(model: str, earlier: str, part: list[str], *, left_out: int, max_tokens: int) -> ModelRequest:
    sections = []
    if earlier:
        sections.append(f"Earlier summary:\n{earlier}")
    if left_out:
        sections.append(f"({left_out} even older messages were too many to summarise and are left out.)")
    sections.append("Conversation to fold into the summary, oldest first:\n\n" + "\n\n".join(part))
    return ModelRequest(
        model=model,
        messages=[ChatMessage(role="system", content=INSTRUCTION), ChatMessage(role="user", content="\n\n".join(sections))],
        tools=[],
        allow_tools=False,
        max_tokens=max_tokens,
    )


async def compact_history(
    agent: "Agent", request: "TurnRequest", *, model: str, history: list[ChatMessage], usage: Usage, emit: Emit,
    tag: UsageTag | None = None,
) -> list[ChatMessage]:
    """The history to send from now on: [summary, kept turns] after compacting, or `history`
    unchanged when no compaction is due or it failed."""
    s = agent.settings
    if not s.compaction:
        return history
    todo = plan(history, threshold_chars=s.compaction_threshold_chars, keep_chars=s.compaction_keep_chars,
                tool_output_chars=s.tool_output_chars)
    if todo is None:
        return history
    n = len(todo.old)
    attributes = {"agentmesh.compaction.messages": len(todo.old), "agentmesh.compaction.chars_before": todo.chars_before,
                  "agentmesh.compaction.covers_through_seq": todo.covers_through_seq}
    emit(StatusEvent(f"the conversation is long; summarising {n} earlier messages"))
    with agent.telemetry.tracer.start_as_current_span(
        "compact_context", kind=SpanKind.INTERNAL, attributes=attributes,
        record_exception=False, set_status_on_exception=False,
    ) as span:
        try:
            text = await _summarise(agent, model, todo, usage, emit, tag)
        except Exception as exc:  # noqa: BLE001 - compaction must never fail the turn; cancellation passes
            reason = exc.message if isinstance(exc, AgentmeshError) else f"{type(exc).__name__}: {exc}"
            log.warning("compaction failed", error=reason)
            span.set_status(Status(StatusCode.ERROR, reason))
            span.set_attribute("error.type", exc.code if isinstance(exc, AgentmeshError) else type(exc).__name__)
            emit(StatusEvent(f"could not summarise earlier messages ({reason}); continuing without a summary, "
                             "leaving the oldest messages out if they do not fit"))
            return history
        covered = todo.covers_through_seq
        summary = ChatMessage(
            role="system", content=f"{SUMMARY_HEADER.format(n=covered)}\n\n{text}", run_id=request.run_id,
            kind=SUMMARY_KIND, covers_through_seq=covered,
        )
        chars_after = context.size_of(summary) + sum(context.size_of(m) for m in todo.kept)
        span.set_attribute("agentmesh.compaction.chars_after", chars_after)
        try:
            await agent.transcripts.append(request.session_id, [summary])
        except AgentmeshError as exc:
            # The summary still serves this turn; the next one summarises again.
            log.warning("compaction summary not saved", error=exc.message)
            emit(StatusEvent(f"could not save the summary ({exc.message}); it will be made again next turn"))
    log.info("compacted history", messages=n, covers_through_seq=covered, chars_before=todo.chars_before,
             chars_after=chars_after)
    emit(StatusEvent(f"compacted {n} earlier messages into a summary ({todo.chars_before:,} → {chars_after:,} characters)"))
    return [summary, *todo.kept]


class Compaction(Capability):
    """Before the turn's first call, summarise the oldest turns when the history is too long."""

    async def prepare_history(self, history: list[ChatMessage]) -> list[ChatMessage]:
        ctx = self.ctx
        # Summaries go to the default model (agent.provider), whatever model the turn named.
        tag = ctx.usage_tag.for_model("default", ctx.agent.model, ctx.agent.provider.name, purpose="compaction")
        return await compact_history(ctx.agent, ctx.request, model=ctx.agent.model, history=history, usage=ctx.usage,
                                     emit=ctx.emit, tag=tag)


def summary_cap_chars(settings: "AgentSettings") -> int:
    """Longest summary kept: a fifth of the budget, and at most a third of the threshold so that
    summary + kept turns stay well under it (else every turn would compact again)."""
    return max(min(settings.context_budget_chars // 5, settings.compaction_threshold_chars // 3), 500)


def pass_chars(settings: "AgentSettings", running_summary_chars: int | None = None) -> int:
    """Old conversation per summary call: the budget less the instruction, the summary going in
    (its real size when known — none at a session's first compaction — else the largest one
    kept) and room for the summary coming out."""
    cap = summary_cap_chars(settings)
    going_in = cap if running_summary_chars is None else min(running_summary_chars, cap)
    return max(settings.context_budget_chars - going_in - cap - len(INSTRUCTION), 2000)


async def _summarise(agent: "Agent", model: str, todo: Plan, usage: Usage, emit: Emit, tag: UsageTag | None) -> str:
    s = agent.settings
    running = todo.earlier.content if todo.earlier is not None else ""
    groups, left_out = passes(todo.old, pass_chars(s), first_limit_chars=pass_chars(s, len(running)))
    if left_out:
        # Passes were dropped from the old end, so the roomier first pass is gone: size every pass
        # alike, which keeps the most of the conversation.
        groups, left_out = passes(todo.old, pass_chars(s))
    for i, part in enumerate(groups):
        request = summary_request(model, running, part, left_out=left_out if i == 0 else 0, max_tokens=s.max_tokens)
        reply = await _call(agent, request, usage, emit, tag)
        running = reply.text.strip()
        if not running:
            raise Unavailable("the model answered with an empty summary")
        # A summary is meant to be short; one that is not must still leave room for the turn.
        running = context.clip(running, summary_cap_chars(s))
    return running


async def _call(agent: "Agent", request: ModelRequest, usage: Usage, emit: Emit, tag: UsageTag | None) -> ModelReply:
    """One summarising model call: a `chat` span like the loop's, its text not streamed to the user."""
    return await traced_model_call(agent.provider, agent.telemetry, request, usage=usage, emit=emit,
                                   stream_text=False, what="summary call",
                                   extra_attributes={"agentmesh.compaction": True}, tag=tag)
