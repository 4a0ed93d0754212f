"""What the embedded store keeps in memory of sessions and transcripts, so that a turn's reads do
not go back to the shards for what this process wrote or read a moment ago.

Every turn reads its session's record several times (each append numbers its messages after the
record's count) and its whole transcript once (StartTurn). From the shards that cost ~10 µs a
message (ids hashed, points retrieved, payloads decoded): 0.5 ms at 50 messages, every turn,
growing with the conversation. Here it is a dictionary lookup.

Why this is sound, and why only in the embedded store: the embedded store belongs to one process
(`memory/LOCK`), and every write to its sessions and messages shards passes through `EdgeStore`,
which writes through this cache *after* Edge has the write in its write-ahead log. The cache
mirrors the shards' points, not what is visible: a message past its session's count (an append
that failed half-way, a dropped run) is cached as the shard holds it, and the transcripts core
decides visibility as before. A write that raises forgets the session, so the next read goes to
the shards. Several memory services sharing one Qdrant server see each other's writes only
through the server, so the server adapter keeps no such cache.

Bounded: entries are kept least-recently-used first and dropped once their estimated size passes
`budget_bytes`; a dropped session is read from the shards again when next asked for.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterable, Sequence

__all__ = ["UNKNOWN", "TranscriptCache"]

UNKNOWN: Any = object()  # a session whose record the cache does not know (None: known not to exist)

# The Python objects of a small payload as Edge returns it (a dict of ~11 entries, its keys and
# values), in bytes, measured with tracemalloc; what
# the payload's texts add to it is counted apart.
_PAYLOAD_OVERHEAD = 1500


def _message_bytes(payload: dict[str, Any]) -> int:
    calls = payload.get("tool_calls") or ()
    return (_PAYLOAD_OVERHEAD + len(payload.get("content") or "")
            + sum(len(c.get("arguments_json") or "") + 400 for c in calls))


def _session_bytes(payload: dict[str, Any] | None) -> int:
    if payload is None:
        return 100
    labels = payload.get("labels") or {}
    return _PAYLOAD_OVERHEAD + len(payload.get("title") or "") + sum(len(k) + len(v) + 100 for k, v in labels.items())


class _Entry:
    __slots__ = ("messages", "session", "size")

    def __init__(self) -> None:
        self.session: Any = UNKNOWN  # the record's payload, None (no such session) or UNKNOWN
        self.messages: dict[int, dict[str, Any]] = {}  # seq -> the message's payload, as stored
        self.size = 0


class TranscriptCache:
    def __init__(self, budget_bytes: int):
        self._budget = budget_bytes
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._size = 0

    def _entry(self, session_id: str) -> _Entry:
        entry = self._entries.get(session_id)
        if entry is None:
            entry = self._entries[session_id] = _Entry()
        else:
            self._entries.move_to_end(session_id)
        return entry

    def _grew(self, entry: _Entry, by: int) -> None:
        entry.size += by
        self._size += by
        while self._size > self._budget and len(self._entries) > 1:
            _, oldest = self._entries.popitem(last=False)
            self._size -= oldest.size
        if self._size > self._budget:  # one session alone is over the budget: keep its record only
            self._size -= sum(_message_bytes(p) for p in entry.messages.values())
            entry.size = self._size
            entry.messages.clear()

    # ---------------------------------------------------------------- session records

    def session(self, session_id: str) -> Any:
        """The record's payload (not to be changed), None if known not to exist, else UNKNOWN."""
        entry = self._entries.get(session_id)
        if entry is None:
            return UNKNOWN
        self._entries.move_to_end(session_id)
        return entry.session

    def put_session(self, session_id: str, payload: dict[str, Any] | None) -> None:
        """What the shard now holds for the session's record (None: nothing)."""
        entry = self._entry(session_id)
        before = 0 if entry.session is UNKNOWN else _session_bytes(entry.session)
        entry.session = payload
        self._grew(entry, _session_bytes(payload) - before)

    # ---------------------------------------------------------------- messages

    def messages(self, session_id: str, seqs: Sequence[int]) -> tuple[dict[int, dict[str, Any]], list[int]]:
        """The cached payloads of `seqs` (not to be changed), and the seqs the cache does not hold."""
        entry = self._entries.get(session_id)
        if entry is None:
            return {}, list(seqs)
        self._entries.move_to_end(session_id)
        held = entry.messages
        return held, [seq for seq in seqs if seq not in held]

    def put_messages(self, session_id: str, payloads: Iterable[dict[str, Any]]) -> None:
        """Messages as the shard now holds them (written, or read from it)."""
        entry = self._entry(session_id)
        grew = 0
        for payload in payloads:
            seq = int(payload["seq"])
            old = entry.messages.get(seq)
            if old is not None:
                grew -= _message_bytes(old)
            entry.messages[seq] = payload
            grew += _message_bytes(payload)
        self._grew(entry, grew)

    def forget(self, session_id: str) -> None:
        """Nothing known of the session: its next reads go to the shards."""
        entry = self._entries.pop(session_id, None)
        if entry is not None:
            self._size -= entry.size

    @property
    def size(self) -> int:
        """The estimated bytes held (tests)."""
        return self._size
