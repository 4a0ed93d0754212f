"""Compaction: when the context nears its model's window, the model summarises the oldest part,
and the summary stands in for it from then on.

Policy (characters, turned into tokens by the model's learned ratio — loop/window.py):
- **When**: at the start of a turn, if the history the model would see (tool outputs already
  cut) is over the budget's threshold — `COMPACT_AT_CHARS`, or 3/4 of what the model's window
  leaves for a request; **between steps**, if the next request (system prompt, tools, history and
  this turn as sent) is over it; and when asked — the `compact` tool, or a turn's
  `ChatOptions.compact` (the REPL's `/compact [focus]`), each with an optional focus.
- **What**: before a turn, the oldest whole turns (a user message and everything up to the next
  one), so a tool call never loses its result; the newest turns that fit in the budget's
  keep share stay verbatim. Between steps, the history and this turn's oldest rounds (an
  assistant reply and its results): the turn's user message and its newest rounds stay. An
  earlier summary is folded into the new one.
- **How**: a tool-less call to the session's model (or `AGENTMESH_COMPACTION_MODEL`) with
  its own instruction, under a `compact_context` span whose `chat {model}` children carry
  `agentmesh.compaction=true`; its tokens count in the turn's usage. An old part too big for one
  call is summarised in passes, each folding in the last.
- **Durability**: the summary is appended to the transcript as a `role: system` message with
  `kind: "summary"` and `covers_through_seq` (the last stored message it replaces). `model_view`
  (context.py) turns a stored transcript into [latest summary] + messages after it covers, so the next turn
  reuses it. A summary made between steps covers what was stored before the turn (the turn's own
  messages have no seq yet): the next turn replays the turn after it and compacts it again if
  it is still too long. The transcript keeps every message; compaction only changes what the model sees.
- **Failure**: a summary call that fails (after the provider's retries) leaves the context as
  it was — `context.fit` then drops the oldest turns as before — with a status note. Compaction
  never fails a turn; cancellation passes through like anywhere else in the turn.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from opentelemetry.trace import SpanKind, Status, StatusCode

from agentmesh.agent.loop import context
from agentmesh.agent.loop.context import SUMMARY_KIND
from agentmesh.agent.loop.model_call import traced_model_call
from agentmesh.agent.loop.model_choice import NamedModel
from agentmesh.agent.loop.turn import Capability, Stop, TurnContext
from agentmesh.agent.loop.usage_log import UsageTag
from agentmesh.agent.loop.window import ContextBudget
from agentmesh.agent.types import (
    ChatMessage,
    ModelReply,
    ModelRequest,
    RunEvent,
    StatusEvent,
    ToolCall,
    ToolOutcome,
    ToolSpec,
    Usage,
)
from agentmesh.errors import AgentmeshError, Unavailable
from agentmesh.logs import get_logger
from agentmesh.toolargs import ArgumentsSchema

if TYPE_CHECKING:  # only type names: the loop runs this capability, never imports it
    from agentmesh.agent.loop.run import Agent
    from agentmesh.agent.loop.turn_request import TurnRequest

log = get_logger("agentmesh.agent.compaction")

SUMMARY_HEADER = (
    "Summary of this conversation up to message {n} (compacted to fit the context; the transcript keeps every "
    "message):"
)
MID_TURN_HEADER = (
    "Summary of this conversation so far, including the earlier steps of the current request (compacted to fit "
    "the context; the transcript keeps every message):"
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


def render(m: ChatMessage, tool_output_chars: int = TOOL_OUTPUT_CHARS) -> str:
    """One message as plain text for the summariser (no tool-call structure to keep valid)."""
    # The summariser reads text: an image is said in a line ("[image: shot.png, 6×5 PNG]"), so the
    # summary can mention what was shown instead of silently losing it.
    images = "".join(f"\n{image.described()}" for image in m.images)
    if m.role == "tool":
        return f"[tool result {m.name or m.tool_call_id}]\n{context.clip(m.content, tool_output_chars)}{images}"
    text = context.clip(m.content, MESSAGE_CHARS) + images
    calls = "".join(
        f"\n[tool call {c.name} {context.clip(c.arguments_json, TOOL_OUTPUT_CHARS)}]" for c in m.tool_calls
    )
    return f"[{m.role}]\n{text}{calls}".rstrip()


def passes(old: list[ChatMessage], limit_chars: int, first_limit_chars: int = 0,
           tool_output_chars: int = TOOL_OUTPUT_CHARS) -> tuple[list[list[str]], int]:
    """The old messages rendered and grouped into passes of at most `limit_chars` each (the first
    may take `first_limit_chars` when larger; a single message larger than the limit is cut);
    returns (passes, number of messages left out)."""
    groups: list[list[str]] = [[]]
    used = 0
    for m in old:
        limit = max(first_limit_chars, limit_chars) if len(groups) == 1 else limit_chars
        text = context.clip(render(m, tool_output_chars), limit_chars)
        if groups[-1] and used + len(text) > limit:
            groups.append([])
            used = 0
        groups[-1].append(text)
        used += len(text) + 2
    left_out = sum(len(g) for g in groups[:-MAX_PASSES])
    return groups[-MAX_PASSES:], left_out


def summary_request(model: str, earlier: str, part: list[str], *, left_out: int, max_tokens: int,
                    focus: str = "") -> ModelRequest:
    sections = []
    if focus:
        sections.append(f"Focus: keep in detail what concerns {focus!r}; be brief about the rest.")
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


@dataclass(frozen=True)
class Summariser:
    """Who writes the summary: a catalogue model, and how its calls are tagged in the ledger."""

    model: NamedModel
    tag: UsageTag | None = None


async def compact_history(
    agent: "Agent", request: "TurnRequest", *, summariser: Summariser, budget: ContextBudget,
    history: list[ChatMessage], usage: Usage, emit: Emit, focus: str = "", force: bool = False,
) -> list[ChatMessage]:
    """The history to send from now on: [summary, kept turns] after compacting, or `history`
    unchanged when no compaction is due or it failed. `force`: whatever its size (on request)."""
    tool_chars = min(agent.settings.tool_output_chars, budget.tool_output_chars)
    # Asked for, everything is summarised: whoever asks wants the room.
    todo = plan(history, threshold_chars=-1 if force else budget.threshold_chars,
                keep_chars=0 if force else budget.keep_chars, tool_output_chars=tool_chars)
    if todo is None:
        return history
    summary = await summarise(agent, request, summariser, budget, todo, usage, emit, focus=focus)
    return history if summary is None else [summary, *todo.kept]


async def summarise(agent: "Agent", request: "TurnRequest", summariser: Summariser, budget: ContextBudget,
                    todo: Plan, usage: Usage, emit: Emit, *, focus: str = "", header: str = SUMMARY_HEADER,
                    ) -> ChatMessage | None:
    """The summary of `todo.old` (folding in `todo.earlier`), saved to the transcript; None when
    the summary call failed (a status note says so)."""
    n = len(todo.old)
    attributes = {"agentmesh.compaction.messages": len(todo.old), "agentmesh.compaction.chars_before": todo.chars_before,
                  "agentmesh.compaction.covers_through_seq": todo.covers_through_seq}
    emit(StatusEvent(f"the conversation is long; summarising {n} earlier messages"))
    with agent.telemetry.tracer.start_as_current_span(
        "compact_context", kind=SpanKind.INTERNAL, attributes=attributes,
        record_exception=False, set_status_on_exception=False,
    ) as span:
        try:
            text = await _summarise(agent, summariser, budget, todo, usage, emit, focus)
        except Exception as exc:  # noqa: BLE001 - compaction must never fail the turn; cancellation passes
            reason = exc.message if isinstance(exc, AgentmeshError) else f"{type(exc).__name__}: {exc}"
            log.warning("compaction failed", error=reason)
            span.set_status(Status(StatusCode.ERROR, reason))
            span.set_attribute("error.type", exc.code if isinstance(exc, AgentmeshError) else type(exc).__name__)
            emit(StatusEvent(f"could not summarise earlier messages ({reason}); continuing without a summary, "
                             "leaving the oldest messages out if they do not fit"))
            return None
        covered = todo.covers_through_seq
        summary = ChatMessage(
            role="system", content=f"{header.format(n=covered)}\n\n{text}", run_id=request.run_id,
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
    return summary


COMPACT = "compact"
COMPACT_SPEC = ToolSpec(
    name=COMPACT,
    description=(
        "Compact the context: the older part of this conversation and of your work so far is replaced by a summary "
        "before your next step (the transcript keeps everything). Use it when the context is getting full or "
        "earlier detail no longer matters; `focus` names what the summary must keep in detail."
    ),
    parameters={
        "type": "object",
        "properties": {"focus": {"type": "string", "maxLength": 500,
                                 "description": "What the summary should keep in detail (optional)."}},
        "additionalProperties": False,
    },
    read_only=True,
)
_SCHEMA = ArgumentsSchema(COMPACT, COMPACT_SPEC.parameters)


class Compaction(Capability):
    """Before the turn's first call and between its steps, summarise the oldest part of the
    context when it nears the budget (or when asked); offers the `compact` tool."""

    def __init__(self, ctx: TurnContext):
        super().__init__(ctx)
        self.cut = 0  # this turn's messages before this index (its user message aside) are summarised
        self.asked: str | None = None  # the `compact` tool's focus, until the next step compacts
        self.failed = False  # a summary call failed this turn: the budget policy trims from then on
        self.on_request = ""  # what a compaction asked for (ChatOptions.compact) did

    def _summariser(self) -> Summariser:
        ctx = self.ctx
        # The setting's model when it names one, else the model the turn is talking to.
        named = ctx.agent.models.get(ctx.agent.compaction_model) if ctx.agent.compaction_model else None
        named = named or ctx.current_model()
        tag = ctx.usage_tag.for_model(named.name, named.model, named.provider.name, purpose="compaction")
        return Summariser(named, tag)

    async def prepare_history(self, history: list[ChatMessage]) -> list[ChatMessage]:
        ctx = self.ctx
        focus, force = ctx.request.compact_focus, ctx.request.compact
        compacted = await compact_history(ctx.agent, ctx.request, summariser=self._summariser(), budget=ctx.budget(),
                                          history=history, usage=ctx.usage, emit=ctx.emit, focus=focus, force=force)
        if force:
            self.on_request = (f"compacted {len(history) - len(compacted) + 1} earlier messages into a summary"
                               if compacted is not history else "nothing to compact")
        return compacted

    async def before_first_call(self, turn: list[ChatMessage]) -> Stop | None:
        # A turn that asked for compaction (ChatOptions.compact, the REPL's /compact) is done.
        if not self.ctx.request.compact:
            return None
        # Its message is stored; an answer after it keeps the transcript a conversation.
        await self.ctx.persist([ChatMessage(role="assistant", content=f"({self.on_request})",
                                            run_id=self.ctx.request.run_id)])
        return Stop("compacted", final_text=self.on_request)

    def tools(self) -> list[ToolSpec]:
        return [COMPACT_SPEC]

    async def execute(self, call: ToolCall) -> ToolOutcome:
        try:
            focus = str(_SCHEMA.parse(call.arguments_json or "{}").get("focus") or "").strip()
        except ValueError as exc:
            return ToolOutcome.error(call, "invalid_arguments", f"error: {exc}")
        self.asked = focus
        return ToolOutcome(call_id=call.call_id, name=call.name,
                           output="The context will be compacted before your next step. Carry on.")

    async def before_step(self, step: int, turn: list[ChatMessage]) -> None:
        ctx = self.ctx
        if step == 1 or self.failed:
            return  # the turn's start has just compacted the history if it had to
        asked, self.asked = self.asked, None
        sent, _ = ctx.fill
        if asked is None and sent and sent < ctx.budget().tokens(ctx.budget().threshold_chars) // 2:
            # The last request was under half the threshold: one round rarely doubles it, and
            # the budget policy covers one that does until the next step. Measuring costs a
            # system prompt and every view, each step of every turn.
            return
        fixed, conversation = ctx.measure(turn)
        # The system prompt and the tools are sent whatever is compacted: the threshold, the part
        # kept and the summary are shares of what they leave.
        budget = ctx.budget()
        budget = dataclasses.replace(budget, cap_chars=max(budget.chars - fixed, 2000))
        if asked is None and conversation <= budget.threshold_chars:
            return
        todo = self._turn_plan(turn, budget)
        if todo is None:
            return  # nothing old enough to summarise: the budget policy trims what is sent
        summary = await summarise(ctx.agent, ctx.request, self._summariser(), budget, todo[0], ctx.usage, ctx.emit,
                                  focus=asked or "", header=MID_TURN_HEADER)
        if summary is None:
            self.failed = True  # one failed summary is enough: no model call spent on it every step
        else:
            ctx.history, self.cut = [summary], todo[1]

    def _turn_plan(self, turn: list[ChatMessage], budget: ContextBudget) -> tuple[Plan, int] | None:
        """What compacting between steps replaces — the history and this turn's older rounds —
        and where this turn's kept rounds start (each round an assistant reply and its results)."""
        ctx = self.ctx
        tool_chars = min(ctx.settings.tool_output_chars, budget.tool_output_chars)
        starts = [i for i, m in enumerate(turn) if m.role == "assistant" and i > self.cut]
        if not starts:
            return None
        cut, kept = starts[-1], 0  # the newest round always stays
        for i in reversed(starts[:-1]):
            kept = sum(context.size_of(m, tool_chars) for m in turn[i:])
            if kept > budget.keep_chars:
                break
            cut = i
        history = ctx.history
        earlier = history[0] if history and history[0].kind == SUMMARY_KIND else None
        old = [*(history[1:] if earlier else history), *turn[max(self.cut, 1):cut]]
        if not old:
            return None
        seqs = [m.seq for m in history if m.seq]
        covers = max(seqs, default=earlier.covers_through_seq if earlier else 0)
        before = sum(context.size_of(m, tool_chars) for m in [*history, *turn])
        return Plan(earlier=earlier, old=old, kept=list(turn[cut:]), covers_through_seq=covers,
                    chars_before=before), cut

    def view(self, messages: list[ChatMessage]) -> list[ChatMessage]:
        # The summary (now the history) stands in for this turn's rounds before the cut.
        return [messages[0], *messages[self.cut:]] if self.cut else messages


def pass_chars(budget: ContextBudget, running_summary_chars: int | None = None) -> int:
    """Old conversation per summary call: the budget less the instruction, the summary going in
    (its real size when known — none at a session's first compaction — else the largest one
    kept) and room for the summary coming out."""
    cap = budget.summary_chars
    going_in = cap if running_summary_chars is None else min(running_summary_chars, cap)
    return max(budget.chars - going_in - cap - len(INSTRUCTION), 2000)


async def _summarise(agent: "Agent", summariser: Summariser, budget: ContextBudget, todo: Plan, usage: Usage,
                     emit: Emit, focus: str) -> str:
    s = agent.settings
    running = todo.earlier.content if todo.earlier is not None else ""
    # A small window gets less of each old output: a twentieth of its budget, so that one pass
    # takes a score of tool results rather than a handful.
    outputs = min(TOOL_OUTPUT_CHARS, max(budget.chars // 20, 300))
    groups, left_out = passes(todo.old, pass_chars(budget), first_limit_chars=pass_chars(budget, len(running)),
                              tool_output_chars=outputs)
    if left_out:
        # Passes were dropped from the old end, so the roomier first pass is gone: size every pass
        # alike, which keeps the most of the conversation.
        groups, left_out = passes(todo.old, pass_chars(budget), tool_output_chars=outputs)
    named = summariser.model
    for i, part in enumerate(groups):
        request = summary_request(named.model, running, part, left_out=left_out if i == 0 else 0,
                                  max_tokens=named.max_output_tokens or s.max_tokens, focus=focus)
        reply = await _call(agent, named, request, usage, emit, summariser.tag)
        running = reply.text.strip()
        if not running:
            raise Unavailable("the model answered with an empty summary")
        # A summary is meant to be short; one that is not must still leave room for the turn.
        running = context.clip(running, budget.summary_chars)
    return running


async def _call(agent: "Agent", named: NamedModel, request: ModelRequest, usage: Usage, emit: Emit,
                tag: UsageTag | None) -> ModelReply:
    """One summarising model call: a `chat` span like the loop's, its text not streamed to the user."""
    request = dataclasses.replace(request, temperature=named.temperature, top_p=named.top_p)
    return await traced_model_call(named.provider, agent.telemetry, request, usage=usage, emit=emit,
                                   stream_text=False, what="summary call",
                                   extra_attributes={"agentmesh.compaction": True}, tag=tag)
