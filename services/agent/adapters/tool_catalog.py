"""The tools service's catalog, kept per namespace between turns while it has not changed.

A turn needs its namespace's catalog before the first model call. Listing it every turn cost a
round trip (and its CPU on both sides) for an answer that changes rarely: only when an MCP
server's tools change, a namespace's server is added or removed, a remote agent's card is read.
The tools service gives its catalog a version that changes with each of those and streams it
(WatchCatalog, services/tools/catalog_version.py); a listing is kept while the version it was
listed at is the last one streamed. No version known — the watch not (yet) open, or broken
while the tools service restarts — means no keeping: every turn lists, as before.

A namespace's own MCP servers are registered with the memory service, which moves the
namespace's `mcp_servers_version` with each change; a turn knows it (its StartTurn reads it
with the namespace's tool policy, session_open.py) and passes it to ListTools, so that a tools replica which has not seen the
change yet reads it first. A listing is therefore kept per (catalog version, namespace's
mcp_servers_version): a server added through another tools replica is listed by the next turn
too.

Promoted tools and skills are not the tools service's: they come with the turn's start from
memory (turn_start.py), so they are never stale either.

    catalog = CachedCatalog(lister)           # lister(namespace, mcp_version) -> Listing
    catalog.version_now(v)                    # from the watch; None when it broke
    specs = await catalog.tools("team", 3.0)  # listed once per version
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


Lister = Callable[[str, "float | None"], Awaitable[Listing]]


@dataclass(frozen=True)
class _Kept:
    listing: Listing
    mcp_version: float | None  # the namespace's mcp_servers_version it was listed for


class CachedCatalog:
    # Namespaces kept at once; the least recently used is listed again when it comes back.
    MAX_NAMESPACES = 1024

    def __init__(self, lister: Lister):
        self._lister = lister
        self._version: str | None = None  # the last one the watch streamed
        self._kept: OrderedDict[str, _Kept] = OrderedDict()

    def version_now(self, version: str | None) -> None:
        """The catalog's version as the tools service streams it; None: not known (no watch)."""
        self._version = version
        if version is None:
            self._kept.clear()

    async def tools(self, namespace: str, mcp_version: float | None = None) -> list[ToolSpec]:
        """`mcp_version`: the namespace's mcp_servers_version as the turn knows it (None: unknown,
        never kept)."""
        kept = self._kept.get(namespace)
        if (kept is not None and self._version is not None and kept.listing.version == self._version
                and mcp_version is not None and kept.mcp_version == mcp_version):
            self._kept.move_to_end(namespace)
            return list(kept.listing.specs)
        listing = await self._lister(namespace, mcp_version)
        if listing.version and self._version is not None and mcp_version is not None:
            # Kept even when newer than the watch's (its message is on the way): it then matches.
            self._kept[namespace] = _Kept(listing, mcp_version)
            self._kept.move_to_end(namespace)
            while len(self._kept) > self.MAX_NAMESPACES:
                self._kept.popitem(last=False)
        return list(listing.specs)
