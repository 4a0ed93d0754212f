"""The tools service's catalog, kept per namespace between turns while it has not changed.

A turn needs its namespace's catalog before the first model call. Listing it every turn cost a
round trip (and its CPU on both sides) for an answer that changes rarely: only when an MCP
server's tools change, a namespace's server is added or removed, a remote agent's card is read.
The tools service gives its catalog a version that changes with each of those and streams it
(WatchCatalog, services/tools/catalog_version.py); a listing is kept while the version it was
listed at is the last one streamed. No version known — the watch not (yet) open, or broken
while the tools service restarts — means no keeping: every turn lists, as before.

Promoted tools and skills are not the tools service's: they come with the turn's start from
memory (turn_start.py), so they are never stale either.

    catalog = CachedCatalog(lister)      # lister(namespace) -> (specs, version)
    catalog.version_now(v)               # from the watch; None when it broke
    specs = await catalog.tools("team")  # listed once per version
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Awaitable, Callable

from agentmesh.agent.types import ToolSpec

__all__ = ["CachedCatalog", "Listing"]


@dataclass(frozen=True)
class Listing:
    specs: list[ToolSpec]
    version: str  # "": a tools service that gives none (never kept)


Lister = Callable[[str], Awaitable[Listing]]


class CachedCatalog:
    # Namespaces kept at once; the least recently used is listed again when it comes back.
    MAX_NAMESPACES = 1024

    def __init__(self, lister: Lister):
        self._lister = lister
        self._version: str | None = None  # the last one the watch streamed
        self._kept: OrderedDict[str, Listing] = OrderedDict()

    def version_now(self, version: str | None) -> None:
        """The catalog's version as the tools service streams it; None: not known (no watch)."""
        self._version = version
        if version is None:
            self._kept.clear()

    async def tools(self, namespace: str) -> list[ToolSpec]:
        kept = self._kept.get(namespace)
        if kept is not None and self._version is not None and kept.version == self._version:
            self._kept.move_to_end(namespace)
            return list(kept.specs)
        listing = await self._lister(namespace)
        if listing.version and self._version is not None:
            # Kept even when newer than the watch's (its message is on the way): it then matches.
            self._kept[namespace] = listing
            self._kept.move_to_end(namespace)
            while len(self._kept) > self.MAX_NAMESPACES:
                self._kept.popitem(last=False)
        return list(listing.specs)
