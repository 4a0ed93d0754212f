"""Which sessions the tools service holds background state for (a background command running, or
ended and not yet collected), as its WatchBackground stream says — so that a turn asks it for
the session's results (BackgroundResults) only when there may be some.

The tools service streams the whole set, then each change, and tells every watcher of a command
started before that `background_run` answers: whichever agent replica runs the session's next
turn (each watches the tools replica its calls go to) knows to collect. Not watching — the
stream not (yet) open, or broken while the tools service restarts, or a tools service without
it — means not knowing: every turn asks, as before.

    known = KnownBackground()
    known.complete({"s1"}); known.changed(pending=["s2"], cleared=["s1"])   # from the watch
    known.lost()                                                            # the watch broke
    known.may_have("s1")  # False only while watching and the session is not listed
"""

from __future__ import annotations

from typing import Iterable

__all__ = ["KnownBackground"]


class KnownBackground:
    def __init__(self) -> None:
        self._pending: set[str] | None = None  # None: not watching

    @property
    def watching(self) -> bool:
        return self._pending is not None

    def complete(self, pending: Iterable[str]) -> None:
        """The whole set (the watch's first message)."""
        self._pending = set(pending)

    def changed(self, pending: Iterable[str], cleared: Iterable[str]) -> None:
        if self._pending is None:
            return  # a change without the set it changes: wait for the next complete one
        self._pending.update(pending)
        self._pending.difference_update(cleared)

    def lost(self) -> None:
        self._pending = None

    def may_have(self, session_id: str) -> bool:
        return self._pending is None or session_id in self._pending
