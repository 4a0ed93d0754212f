"""Keeping an npx/uvx package cache (fetch.py) to its size: the least recently used installs go first.

A cache is one directory — the deployment's servers' (`<root>/packages/`) or one namespace's
(`<root>/namespaces/<namespace>.servers/packages/`) — holding one directory per installed package, marked
when finished (FETCHED_MARK); the mark's modification time is when a server last started from it.
Every entry of a cache is a candidate except an install a running server uses or one being made
(`busy`). What is not a finished install (`*.partial` and `*.downloads` an install left behind,
the shared download caches `npm-cache/` and `uv-cache/` of earlier releases) always goes; then
finished installs, the least recently used first, until the cache holds no more than its ceiling. A package pruned is
installed again at its server's next start.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from agentmesh.logs import get_logger
from agentmesh.tools.mcp.packages import FETCHED_MARK
from agentmesh.tools.quota import measure_workspace, mib

__all__ = ["Pruned", "cache_dirs", "prune_cache", "touch"]

log = get_logger("agentmesh.tools.mcp")
_UNFINISHED = float("-inf")


@dataclass(frozen=True)
class Pruned:
    removed: tuple[str, ...]  # the entries removed, in the order they were
    size: int  # what the cache holds afterwards


def cache_dirs(root: Path) -> list[Path]:
    """The package caches under the servers' root: the deployment's and each namespace's."""
    namespaces = sorted({*root.glob("*.servers/packages"), *root.glob("*/*.servers/packages")})
    return [p for p in (root / "packages", *namespaces) if p.is_dir()]


def touch(install: Path) -> None:
    """Note that a server starts from `install` now (its mark's time orders the pruning)."""
    try:
        os.utime(install / FETCHED_MARK)
    except OSError:
        pass  # not marked (yet): such an entry is pruned first anyway


async def prune_cache(cache: Path, ceiling: int, busy: Collection[Path] = ()) -> Pruned:
    """Remove what `cache` holds past `ceiling` bytes, never an entry in `busy` (on a thread: a
    cache of many installs takes a while to measure)."""
    return await asyncio.to_thread(_prune, cache, ceiling, {Path(p) for p in busy})


def _prune(cache: Path, ceiling: int, busy: set[Path]) -> Pruned:
    try:
        entries = [cache / name for name in os.listdir(cache)]
    except OSError:
        return Pruned((), 0)
    sizes = {entry: _size(entry) for entry in entries}
    size = sum(sizes.values())
    removed: list[str] = []
    for entry in sorted((e for e in entries if e not in busy), key=_last_used):
        if size <= ceiling and _last_used(entry) != _UNFINISHED:
            break
        _remove(entry)
        size -= sizes[entry]
        removed.append(entry.name)
    if removed:
        log.info("mcp package cache pruned", cache=str(cache), removed=removed, size=mib(size), ceiling=mib(ceiling))
    if size > ceiling:
        log.warning("mcp package cache is over its ceiling with what running servers use", cache=str(cache),
                    size=mib(size), ceiling=mib(ceiling))
    return Pruned(tuple(removed), size)


def _last_used(entry: Path) -> float:
    """When a server last started from the install; an unfinished entry sorts before any."""
    try:
        return os.stat(entry / FETCHED_MARK).st_mtime
    except OSError:
        return _UNFINISHED


def _size(entry: Path) -> int:
    """Bytes the entry takes on disk: a directory's contents (measure_workspace), a file's own."""
    try:
        if entry.is_dir() and not entry.is_symlink():
            return measure_workspace(entry).bytes
        return os.lstat(entry).st_blocks * 512
    except OSError:
        return 0  # removed meanwhile


def _remove(entry: Path) -> None:
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry, ignore_errors=True)
    else:
        entry.unlink(missing_ok=True)
