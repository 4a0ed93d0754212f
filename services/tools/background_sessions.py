"""Which sessions have background state in this replica — a background command running, or
ended and not yet collected — streamed to whoever watches (the agent, through WatchBackground),
so that a turn in a session without any makes no BackgroundResults call.

The stream sends the whole set first, then each change. A session gains state only through a
tool call (`background_run`), whose answer waits (briefly) until every watcher's stream has
written the change (`settled()`): the next turn of that session, on whichever agent replica
watches this tools replica, knows to collect. A session loses its state when its results are
collected or read (BackgroundResults, `background_check`) or its workspace is deleted; a
watcher that hears of that late only makes one call that finds nothing.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import AsyncIterator

__all__ = ["BackgroundSessions", "Change"]


@dataclass(frozen=True)
class Change:
    complete: bool  # True: `pending` is the whole set (a watch's first message)
    pending: list[str]
    cleared: list[str]


@dataclass(eq=False)
class _Watcher:
    changes: dict[str, bool] = field(default_factory=dict)  # session -> has state, not yet sent
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    delivered: int = 0  # the generation its stream has written


class BackgroundSessions:
    def __init__(self) -> None:
        self._pending: set[str] = set()
        self._generation = 0
        self._watchers: set[_Watcher] = set()
        self._closed = False
        self._written = asyncio.Event()  # set whenever a watcher's stream has written something

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._pending

    def set(self, session_id: str, pending: bool) -> None:
        """The session has background state (`pending`) or none any more."""
        if (session_id in self._pending) == pending:
            return
        if pending:
            self._pending.add(session_id)
        else:
            self._pending.discard(session_id)
        self._generation += 1
        for watcher in self._watchers:
            watcher.changes[session_id] = pending
            watcher.wakeup.set()

    async def watch(self) -> AsyncIterator[Change]:
        """The whole set, then each change, until `close()`. The stream's consumer asks for the
        next value only once it has written the previous one (gRPC's server streaming), which
        is what `settled()` relies on."""
        watcher = _Watcher()
        self._watchers.add(watcher)
        try:
            generation = self._generation
            yield Change(True, sorted(self._pending), [])
            self._delivered(watcher, generation)
            while not self._closed:
                if not watcher.changes:
                    watcher.wakeup.clear()
                    await watcher.wakeup.wait()
                    continue
                generation, changes, watcher.changes = self._generation, watcher.changes, {}
                yield Change(False, [s for s, p in changes.items() if p], [s for s, p in changes.items() if not p])
                self._delivered(watcher, generation)
        finally:
            self._watchers.discard(watcher)
            self._written.set()  # one watcher fewer to wait for

    def _delivered(self, watcher: _Watcher, generation: int) -> None:
        watcher.delivered = generation
        self._written.set()

    async def settled(self, within_s: float = 1.0) -> bool:
        """Wait until every watcher has written every change made so far (at most `within_s`);
        whether they all had."""
        target = self._generation
        try:
            async with asyncio.timeout(within_s):
                while any(w.delivered < target for w in self._watchers):
                    self._written.clear()
                    await self._written.wait()
        except TimeoutError:
            return False
        return True

    async def close(self, grace_s: float = 0.0) -> None:
        """End every watch (the service drains: an open stream would hold the drain up)."""
        self._closed = True
        for watcher in self._watchers:
            watcher.wakeup.set()
