"""Token budgets per turn and per session (`TURN_TOKEN_BUDGET`, `SESSION_TOKEN_BUDGET`, and the
turn's `ChatOptions.token_budget` / `session_token_budget`, which may only tighten them).

Tokens are the provider's counts (input + output) of every model call the turn makes: steps,
plans, summaries, continuations, and sub-agents' calls (a child's usage is added to its
parent's; a child starts with what is left of its parent's budget as its own). When the count
passes `BUDGET_WARN_AT` of a budget, a `status` event says so and the model is told to wrap up;
when a budget is used up, the turn stops cleanly after the reply that used it up: that reply
is kept, its tool calls are not run, and `run_finished.stop_reason` is `"budget"`.

A session's count is durable: each turn under a session budget appends a `kind: "usage"` entry
(role `system`, content `{"input_tokens": …, "output_tokens": …}`) to the transcript; the model
never sees these entries, and the next turn (any replica) sums them.
"""

from __future__ import annotations

import json
import logging

from agentmesh.agent.loop.turn import Capability, Stop, TurnContext, Verdict
from agentmesh.agent.types import ChatMessage, ModelReply, StatusEvent, Usage

USAGE_KIND = "usage"
WARN_NOTE = (
    "Budget: {used:,} of the {limit:,} tokens allowed for this {scope} are used. Wrap up: finish the essential work "
    "and give your answer soon."
)
STOPPED = "Stopped: the token budget for this {scope} ({limit:,} tokens) is used up ({used:,} used)."

log = logging.getLogger("agentmesh.agent.budget")


def effective(configured: int, requested: int) -> int:
    """The tighter of two budgets, 0 meaning none."""
    limits = [b for b in (configured, requested) if b > 0]
    return min(limits) if limits else 0


def session_usage(stored: list[ChatMessage]) -> Usage:
    """Tokens recorded by earlier turns' usage entries."""
    total = Usage()
    for m in stored:
        if m.kind != USAGE_KIND:
            continue
        try:
            data = json.loads(m.content)
            total.add(Usage(int(data.get("input_tokens", 0)), int(data.get("output_tokens", 0))))
        except (ValueError, TypeError, AttributeError):
            log.warning("ignoring a malformed usage entry at seq %s", m.seq)
    return total


def usage_entry(usage: Usage, run_id: str) -> ChatMessage:
    content = json.dumps({"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens})
    return ChatMessage(role="system", content=content, run_id=run_id, kind=USAGE_KIND)


def applies(ctx: TurnContext) -> bool:
    return bool(turn_limit(ctx) or session_limit(ctx))


def turn_limit(ctx: TurnContext) -> int:
    return effective(ctx.settings.turn_token_budget, ctx.request.token_budget)


def session_limit(ctx: TurnContext) -> int:
    return effective(ctx.settings.session_token_budget, ctx.request.session_token_budget)


class TokenBudget(Capability):
    def __init__(self, ctx: TurnContext):
        super().__init__(ctx)
        self.turn_limit = turn_limit(ctx)
        self.session_limit = session_limit(ctx)
        self.earlier = 0  # tokens of the session's earlier turns
        self.warned: set[str] = set()
        self.note = ""

    async def prepare_history(self, history: list[ChatMessage]) -> list[ChatMessage]:
        if self.session_limit:
            self.earlier = session_usage(self.ctx.stored).total_tokens
        return history

    def _scopes(self) -> list[tuple[str, int, int]]:
        """(scope, used, limit) for each budget in force."""
        used = self.ctx.usage.total_tokens
        out = []
        if self.turn_limit:
            out.append(("turn", used, self.turn_limit))
        if self.session_limit:
            out.append(("session", self.earlier + used, self.session_limit))
        return out

    async def before_first_call(self, turn: list[ChatMessage]) -> None:
        await self.before_step(0, turn)
        return None

    async def before_step(self, step: int, turn: list[ChatMessage]) -> None:
        warn_at = self.ctx.settings.budget_warn_at
        for scope, used, limit in self._scopes():
            if scope not in self.warned and used >= warn_at * limit:
                self.warned.add(scope)
                self.ctx.emit(StatusEvent(f"{used:,} of the {limit:,}-token {scope} budget used "
                                          f"({used / limit:.0%}); asking the model to wrap up"))
                self.note = WARN_NOTE.format(used=used, limit=limit, scope=scope)

    def view(self, messages: list[ChatMessage]) -> list[ChatMessage]:
        return [*messages, ChatMessage(role="system", content=self.note)] if self.note else messages

    async def after_reply(self, step: int, reply: ModelReply, turn: list[ChatMessage]) -> Verdict:
        if not reply.tool_calls:
            return None  # an answer: the turn completes with it
        for scope, used, limit in self._scopes():
            if used >= limit:
                self.ctx.emit(StatusEvent(f"the {scope} token budget is used up ({used:,} of {limit:,}); stopping"))
                text = reply.text.strip() or STOPPED.format(scope=scope, limit=limit, used=used)
                return Stop("budget", final_text=text,
                            not_run=f"error: not run: the token budget for this {scope} is used up")
        return None

    async def after_turn(self, stop_reason: str) -> None:
        if self.session_limit and self.ctx.usage.total_tokens:
            await self.ctx.persist([usage_entry(self.ctx.usage, self.ctx.request.run_id)])
