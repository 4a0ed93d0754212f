"""The context budget of one model call, in tokens, from the model's window.

A model's window (its catalogue entry's `context_window`, or the agent's
`AGENTMESH_AGENT_CONTEXT_WINDOW` when the entry names none) less the room kept for the answer
(`max_tokens` when one is sent, else `ANSWER_SHARE` of the window) is what a request may take.

Tokens are counted without a tokenizer: the context policy (context.py) measures characters,
and a ratio of characters per token turns them into tokens. The ratio is learned per model
from the provider's real counts (`usage.prompt_tokens` of each reply against the characters of
the request that produced it; a lower ratio is taken at once, a higher one moves the average); until a model has answered, `START_CHARS_PER_TOKEN` — lower
than English prose's ~4, so an unknown model's budget errs on the side of fitting. Every
budget in characters is taken at `SAFETY` of the learned ratio, so a request that tokenizes a
little worse than the last ones still fits.

`AGENTMESH_AGENT_CONTEXT_BUDGET_CHARS`, when set, caps the budget in characters as well.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

__all__ = ["ANSWER_SHARE", "START_CHARS_PER_TOKEN", "Calibration", "ContextBudget"]

START_CHARS_PER_TOKEN = 3.0
# Bounds on a learned ratio: a reply with absurd usage (a server counting something else)
# must not blow the budget open or shut.
MIN_CHARS_PER_TOKEN, MAX_CHARS_PER_TOKEN = 1.0, 8.0
SAFETY = 0.9
# Without a max_tokens, this share of the window is kept for the answer (at most 8192 tokens).
ANSWER_SHARE = 0.125
# How much one observation moves the learned ratio (an exponential moving average).
LEARN_RATE = 0.5


@dataclass(frozen=True)
class ContextBudget:
    """One call's budget: what the model's window leaves for the request, and its ratio."""

    window_tokens: int
    answer_tokens: int  # kept for the answer
    chars_per_token: float
    cap_chars: int = 0  # AGENTMESH_AGENT_CONTEXT_BUDGET_CHARS; 0: none
    compact_at_chars: int = 0  # AGENTMESH_AGENT_COMPACT_AT_CHARS; 0: 3/4 of the budget
    compact_keep_chars: int = 0  # AGENTMESH_AGENT_COMPACT_KEEP_CHARS; 0: 1/4 of the budget

    @classmethod
    def of(cls, window_tokens: int, *, max_tokens: int, chars_per_token: float, cap_chars: int = 0,
           compact_at_chars: int = 0, compact_keep_chars: int = 0) -> "ContextBudget":
        answer = max_tokens or min(int(window_tokens * ANSWER_SHARE), 8192)
        # A max_tokens near the window would leave nothing: the request keeps at least half.
        answer = min(answer, window_tokens // 2)
        return cls(window_tokens, answer, chars_per_token, cap_chars, compact_at_chars, compact_keep_chars)

    @property
    def request_tokens(self) -> int:
        return self.window_tokens - self.answer_tokens

    @property
    def chars(self) -> int:
        """The most characters a request may hold (the context policy's budget)."""
        chars = int(self.request_tokens * self.chars_per_token * SAFETY)
        return min(chars, self.cap_chars) if self.cap_chars else chars

    @property
    def threshold_chars(self) -> int:
        """Compact when the context passes this."""
        return min(self.compact_at_chars, self.chars) if self.compact_at_chars else self.chars * 3 // 4

    @property
    def keep_chars(self) -> int:
        # Never more than half the threshold, or a compacted context could be over it again at once.
        return min(self.compact_keep_chars or self.chars // 4, self.threshold_chars // 2)

    @property
    def summary_chars(self) -> int:
        """Longest summary kept: a fifth of the budget and at most a third of the threshold, so
        that summary + kept part stay well under it (else every call would compact again)."""
        return max(min(self.chars // 5, self.threshold_chars // 3), 500)

    @property
    def tool_output_chars(self) -> int:
        """One tool output may take at most a quarter of the budget."""
        return max(self.chars // 4, 200)

    def tokens(self, chars: int) -> int:
        """The estimated tokens of `chars` characters of context."""
        return -(-chars * 10 // int(self.chars_per_token * 10))


class Calibration:
    """Characters per token, learned per model from the usage its replies report. Shared by all
    turns of the service (a lock: turns run in one event loop, but sub-agents' and tests'
    threads may read it too)."""

    def __init__(self) -> None:
        self._ratios: dict[str, float] = {}
        self._lock = threading.Lock()

    def ratio(self, model: str) -> float:
        with self._lock:
            return self._ratios.get(model, START_CHARS_PER_TOKEN)

    def observe(self, model: str, chars: int, prompt_tokens: int) -> None:
        """A request of `chars` characters was counted as `prompt_tokens` by the server."""
        if prompt_tokens <= 0 or chars <= 0:
            return  # the server reported no usage: nothing to learn
        seen = min(max(chars / prompt_tokens, MIN_CHARS_PER_TOKEN), MAX_CHARS_PER_TOKEN)
        with self._lock:
            known = self._ratios.get(model)
            # Down at once (fewer characters per token: the next request may not fit), up slowly.
            self._ratios[model] = seen if known is None or seen < known else known + LEARN_RATE * (seen - known)
