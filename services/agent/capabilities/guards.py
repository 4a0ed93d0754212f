"""Capabilities that keep a long turn on track and let it finish well (docs/agent.md, "A loop
that finishes well"). Each one is switched off by its setting being 0.

- `WrapUp` — `WRAP_UP_STEPS` steps before the step budget runs out, a note tells the model to
  finish; at the budget the loop's forced summary follows as before.
- `ToolOutputTrim` — in what is sent each step, this turn's tool results older than the newest
  `KEEP_TOOL_RESULTS` (and than the newest that fit in a third of the model's context budget)
  become a one-line placeholder. Zero model calls; the transcript keeps them. Not a result that
  calling again cannot give back (`read_inbox` hands each message out once): that stays whole.
- `RepeatGuard` — the same call with the same arguments `REPEAT_LIMIT` times in a row, or two
  calls alternating A-B-A-B, is a loop: the model is told once; if it goes on, the turn ends
  with `stop_reason: "loop"`.
"""

from __future__ import annotations

import json

from agentmesh.agent.capabilities.team_specs import READ_INBOX
from agentmesh.agent.loop.turn import Capability, Stop, TurnContext, Verdict
from agentmesh.agent.types import ChatMessage, ModelReply, StatusEvent, ToolCall

WRAP_UP_NOTE = (
    "Wrap up: {left} of your {steps} tool-using steps {verb} left, this one included. Finish the essential work "
    "now and end with your answer; after that, no more tools can be called."
)
TRIMMED = "[{name} output from an earlier step ({chars:,} characters) left out to save room; call again if needed]"
REPEAT_NOTE = (
    "You are repeating yourself: {what}. Doing the same again will give the same result. Change your approach "
    "(other arguments, another tool) or give your answer now; if the repetition goes on, the turn is stopped."
)
# Calls that wait for someone else to act: the same call again is progress, not a loop.
WAITS = frozenset({READ_INBOX.name})
# Results that calling again does not give back — read_inbox hands each message out once, and
# the mailbox cursor has moved past it — so trimming them would lose what they delivered (seen:
# a lead waiting forever for a result its own inbox had handed it eight steps before).
ONCE = frozenset({READ_INBOX.name})
LOOP_STOPPED = "Stopped: the agent kept repeating itself ({what}) after being told; no further steps were taken."


class WrapUp(Capability):
    def __init__(self, ctx: TurnContext):
        super().__init__(ctx)
        self.note = ""

    async def before_step(self, step: int, turn: list[ChatMessage]) -> None:
        steps, window = self.ctx.step_budget, self.ctx.settings.wrap_up_steps
        left = steps - step + 1
        if step == 1 or left > window:
            return
        if not self.note:
            self.ctx.emit(StatusEvent(f"{left} of {steps} steps left: asking the model to wrap up"))
        self.note = WRAP_UP_NOTE.format(left=left, steps=steps, verb="is" if left == 1 else "are")

    def view(self, messages: list[ChatMessage]) -> list[ChatMessage]:
        return [*messages, ChatMessage(role="system", content=self.note)] if self.note else messages


def trim_old_tool_results(messages: list[ChatMessage], keep: int, keep_chars: int = 0) -> list[ChatMessage]:
    """Every tool result but the newest `keep` replaced by a one-line placeholder (when shorter).
    `keep_chars`: the newest results kept also hold at most this many characters together (the
    newest one always stays), so a small window is not filled by its last few outputs. The
    results of the tools in ONCE are neither trimmed nor counted."""
    positions = [i for i, m in enumerate(messages) if m.role == "tool" and m.name not in ONCE]
    if keep_chars and keep:
        held, size = 0, 0
        for i in reversed(positions[-keep:]):
            size += len(messages[i].content)
            if held and size > keep_chars:
                break
            held += 1
        keep = held
    old = positions[:-keep] if keep else positions
    if not old:
        return messages
    out = list(messages)
    for i in old:
        m = out[i]
        placeholder = TRIMMED.format(name=m.name or "tool", chars=len(m.content))
        if len(m.content) > len(placeholder):
            out[i] = ChatMessage(role="tool", content=placeholder, tool_call_id=m.tool_call_id, name=m.name,
                                 run_id=m.run_id, seq=m.seq)
    return out


class ToolOutputTrim(Capability):
    def view(self, messages: list[ChatMessage]) -> list[ChatMessage]:
        # The newest results kept verbatim take at most a third of what the model's window leaves.
        return trim_old_tool_results(messages, self.ctx.settings.keep_tool_results, self.ctx.budget().chars // 3)


def signature(calls: tuple[ToolCall, ...]) -> tuple[tuple[str, str], ...]:
    """What a reply asked for, independent of call ids and of key order in the arguments."""

    def normal(arguments_json: str) -> str:
        try:
            return json.dumps(json.loads(arguments_json or "{}"), sort_keys=True)
        except (ValueError, RecursionError):  # bad or absurdly nested JSON: compared as written
            return arguments_json

    return tuple(sorted((c.name, normal(c.arguments_json)) for c in calls))


def describe(sig: tuple[tuple[str, str], ...]) -> str:
    text = ", ".join(f"{name} {args}" for name, args in sig)
    return text if len(text) <= 160 else text[:159] + "…"


class RepeatGuard(Capability):
    def __init__(self, ctx: TurnContext):
        super().__init__(ctx)
        self.seen: list[tuple[tuple[str, str], ...]] = []
        self.warned = False
        self.note = ""
        self.step = 0
        self.note_step = 0  # the warning goes with the one call after the repetition

    def looping(self) -> str:
        """What the model is repeating, or "" when it is not."""
        seen, limit = self.seen, self.ctx.settings.repeat_limit
        if len(seen) >= limit and len(set(seen[-limit:])) == 1:
            return f"the same call ({describe(seen[-1])}) {limit} times in a row"
        if len(seen) >= 4 and seen[-1] == seen[-3] and seen[-2] == seen[-4] and seen[-1] != seen[-2]:
            return f"two calls in turn, again and again ({describe(seen[-2])}; then {describe(seen[-1])})"
        return ""

    async def before_step(self, step: int, turn: list[ChatMessage]) -> None:
        self.step = step

    async def after_reply(self, step: int, reply: ModelReply, turn: list[ChatMessage]) -> Verdict:
        if not reply.tool_calls:
            return None
        if all(c.name in WAITS for c in reply.tool_calls):
            return None  # waiting for others (a lead's read_inbox) repeats by design, and progresses
        self.seen.append(signature(reply.tool_calls))
        what = self.looping()
        if not what:
            return None
        if self.warned:
            self.ctx.emit(StatusEvent(f"stopping: the model is still repeating itself ({what})"))
            return Stop("loop", final_text=reply.text.strip() or LOOP_STOPPED.format(what=what),
                        not_run="error: not run: the turn was stopped because the agent kept repeating itself")
        self.warned = True
        self.ctx.emit(StatusEvent(f"the model is repeating itself ({what}); telling it to change course"))
        self.note, self.note_step = REPEAT_NOTE.format(what=what), step + 1
        return None

    def view(self, messages: list[ChatMessage]) -> list[ChatMessage]:
        if self.note and self.step == self.note_step:
            return [*messages, ChatMessage(role="system", content=self.note)]
        return messages
