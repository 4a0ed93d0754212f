"""A feed: what a running turn has produced so far, that any number of readers follow.

One writer adds items; each reader starts at an index of its choice, gets everything from there
in order, then waits for more until the writer finishes. Nothing is copied per reader and a slow
reader holds nobody up. The gateway keeps one per running turn (live.py: `AttachTurn` joins a
turn from any event) and the HTTP server one per turn it started (http/sse.py: a dropped SSE
stream resumes with Last-Event-ID) — the same mechanism on both sides.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Generic, TypeVar

__all__ = ["Feed"]

T = TypeVar("T")


class Feed(Generic[T]):
    def __init__(self) -> None:
        self.items: list[T] = []
        self.done = False
        # What readers that caught up wait on; made only when one does, so a feed nobody
        # follows (most turns) costs a list append per item.
        self._changed: asyncio.Event | None = None

    def add(self, item: T) -> None:
        self.items.append(item)
        self._wake()

    def finish(self) -> None:
        self.done = True
        self._wake()

    def _wake(self) -> None:
        # The waiting readers wake; later ones wait on a fresh event.
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def follow(self, start: int = 0) -> AsyncIterator[T]:
        """The items from index `start`, waiting for new ones until the feed is finished."""
        index = start
        while True:
            # Taken before yielding: an item added while the reader is away wakes it at once.
            if self._changed is None:
                self._changed = asyncio.Event()
            waiter = self._changed
            while index < len(self.items):
                yield self.items[index]
                index += 1
            if self.done:
                return
            await waiter.wait()
