"""The catalog's version: a value that changes whenever any namespace's tool catalog may have
changed, streamed to whoever watches it (the agent, through WatchCatalog), so a caller can keep
a listing for as long as the version it was listed at holds instead of listing per turn.

What changes a catalog while the service runs: an MCP server's tools listed again (after its
`list_changed`, or a restart), a namespace's server added, removed or started, a remote A2A
agent's card read. Each of those calls `changed()`. The version is this process's random id and
a generation, so a restarted service never repeats an old value.

Delivery: `settled()` waits (briefly) until every watcher's stream has written the current
version, so a change made through an RPC (AddMcpServer) is on its way to every agent before
that RPC answers, ahead of the next turn the caller starts.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import AsyncIterator

__all__ = ["CatalogVersions"]


class _Watcher:
    delivered = ""


class CatalogVersions:
    SETTLE_POLL_S = 0.005

    def __init__(self) -> None:
        self._process = secrets.token_hex(6)
        self._generation = 0
        self._wakeups: set[asyncio.Event] = set()
        self._watchers: set[_Watcher] = set()
        self._closed = False

    @property
    def current(self) -> str:
        return f"{self._process}.{self._generation}"

    def changed(self) -> None:
        """Some catalog changed (or may have): every watcher gets a new version."""
        self._generation += 1
        for wakeup in self._wakeups:
            wakeup.set()

    async def watch(self) -> AsyncIterator[str]:
        """The current version, then each new one, until `close()`. The stream's consumer asks
        for the next value only once it has written the previous one (gRPC's server streaming),
        which is what `settled()` relies on."""
        watcher = _Watcher()
        self._watchers.add(watcher)
        try:
            while not self._closed:
                version = self.current
                if version != watcher.delivered:
                    yield version
                    watcher.delivered = version
                    continue
                wakeup = asyncio.Event()
                self._wakeups.add(wakeup)
                try:
                    await wakeup.wait()
                finally:
                    self._wakeups.discard(wakeup)
        finally:
            self._watchers.discard(watcher)

    async def settled(self, within_s: float = 1.0) -> bool:
        """Wait until every watcher has written the current version (at most `within_s`);
        whether they all had."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        while any(w.delivered != self.current for w in self._watchers):
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(self.SETTLE_POLL_S)
        return True

    async def close(self, grace_s: float = 0.0) -> None:
        """End every watch (the service drains: an open stream would hold the drain up)."""
        self._closed = True
        for wakeup in self._wakeups:
            wakeup.set()
