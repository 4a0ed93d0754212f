"""Keeping the memory service's heap from holding on to memory it has freed (glibc only).

Two things made a memory service that had refused large requests keep tens of MB it no longer
used (tests/security/test_request_bounds.py):

- With Qdrant Edge in the process, glibc's dynamic mmap threshold rises (a freed large block
  raises it), and multi-megabyte gRPC request buffers then stay in the heap once freed: 100
  refused 15 MB requests kept 78-87 MiB. A fixed 128 KiB threshold hands such buffers back to
  the OS (`fix_mmap_threshold`).
- gRPC reads a request in pieces below that threshold, on its own threads, each with its own
  malloc arena; freed, they stay in the arenas as free chunks between live ones. 100 refused
  15 MB requests then left 4-90 MiB more, differently each run (ten runs, measured as the
  test does). `HeapReleaser` gives such free pages back (`malloc_trim`)
  when the heap has grown since it last did: 3-26 MiB after the same 100 requests (five runs).
"""

from __future__ import annotations

import asyncio
import ctypes
import os

CHECK_EVERY_S = 1.0
GROWTH_BYTES = 8 * 1024 * 1024  # anonymous memory grown since the last release that starts the next
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim  # noqa: B018 - glibc only
        return libc
    except (OSError, AttributeError):  # not glibc: nothing to adjust
        return None


def fix_mmap_threshold() -> None:
    libc = _libc()
    if libc is not None:
        libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD


def anonymous_bytes() -> int:
    """Resident memory not backed by a file (heap, arenas), from /proc/self/statm."""
    with open("/proc/self/statm") as f:
        fields = f.read().split()
    return (int(fields[1]) - int(fields[2])) * _PAGE


class HeapReleaser:
    """Every second, if the anonymous RSS grew by GROWTH_BYTES since the last release, return
    free heap pages to the OS. `malloc_trim` runs on a thread (ctypes lets go of the GIL), so
    the event loop goes on meanwhile; it costs a few ms at a small heap, and nothing while the
    service's memory holds still."""

    def __init__(self) -> None:
        self._libc = _libc()
        self._task: asyncio.Task[None] | None = None
        self.releases = 0

    def start(self) -> None:
        if self._libc is not None and os.path.exists("/proc/self/statm"):
            self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        libc = self._libc
        assert libc is not None
        level = anonymous_bytes()
        while True:
            await asyncio.sleep(CHECK_EVERY_S)
            now = anonymous_bytes()
            if now - level >= GROWTH_BYTES:
                await asyncio.to_thread(libc.malloc_trim, 0)
                self.releases += 1
                now = anonymous_bytes()
            level = min(level, now) if now < level else now

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
