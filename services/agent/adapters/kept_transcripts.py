"""The transcripts this agent process read at its turns' starts, kept so that the next turn's
StartTurn asks memory only for what was appended since.

Without it every turn's start brought the whole conversation: memory read and encoded, and the
agent decoded, each message of it (~2–5 µs a message each side), a cost growing with the
conversation at every turn. With it, a turn's start names the seq it holds through and the
generation it read that at (StartTurnRequest.known_through_seq, known_generation), and memory
answers the messages after it — the previous turn's own, and anything another agent replica or
a teammate appended meanwhile.

Why a kept copy is never wrong: memory gives the transcript a new generation whenever it changes
other than by an append (a run dropped, the transcript cleared, the session deleted and created
again or restored), and answers a tail only when the generation named is still the stored one;
otherwise the whole transcript comes back and replaces the copy. The copy is never trusted on
its own: each process keeps its own, and what it holds is only ever what memory answered.

Bounded: least-recently-used sessions go first once there are more than `max_sessions` or their
estimated size passes `max_bytes`; a session no longer kept is read whole at its next turn.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

from agentmesh.agent.types import ChatMessage

__all__ = ["Kept", "KeptTranscripts"]

# A ChatMessage's Python objects beyond its texts, in bytes (a frozen dataclass and its strings).
_MESSAGE_OVERHEAD = 600


def _size(messages: Sequence[ChatMessage]) -> int:
    return sum(_MESSAGE_OVERHEAD + len(m.content) + sum(len(c.arguments_json) + 200 for c in m.tool_calls)
               for m in messages)


@dataclass(frozen=True)
class Kept:
    """A session's transcript as memory answered it: seqs 1..through_seq, at `generation`."""

    generation: str
    messages: tuple[ChatMessage, ...]
    size: int

    @property
    def through_seq(self) -> int:
        return self.messages[-1].seq if self.messages else 0


class KeptTranscripts:
    def __init__(self, max_sessions: int = 256, max_bytes: int = 64 << 20):
        self._max_sessions = max_sessions
        self._max_bytes = max_bytes
        self._kept: OrderedDict[str, Kept] = OrderedDict()
        self._bytes = 0

    def get(self, session_id: str) -> Kept | None:
        kept = self._kept.get(session_id)
        if kept is not None:
            self._kept.move_to_end(session_id)
        return kept

    def put(self, session_id: str, generation: str, base: Kept | None, after: Sequence[ChatMessage]) -> Kept:
        """Keep `base`'s messages (None: none) followed by `after`, read at `generation`."""
        messages = (*base.messages, *after) if base is not None else tuple(after)
        kept = Kept(generation, messages, (base.size if base is not None else 0) + _size(after))
        self.forget(session_id)
        if kept.size > self._max_bytes or self._max_sessions <= 0:
            return kept  # one session alone over the bound: read whole at each turn, as without
        self._kept[session_id] = kept
        self._bytes += kept.size
        while len(self._kept) > self._max_sessions or self._bytes > self._max_bytes:
            _, oldest = self._kept.popitem(last=False)
            self._bytes -= oldest.size
        return kept

    def forget(self, session_id: str) -> None:
        gone = self._kept.pop(session_id, None)
        if gone is not None:
            self._bytes -= gone.size

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def size(self) -> int:
        """The estimated bytes held."""
        return self._bytes
