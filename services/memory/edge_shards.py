"""A Qdrant Edge shard that gets its indexes built without stalling the service.

New points land in the shard's appendable segment and are searchable at once (brute force). Once
`index_after` points have arrived since the last build, the shard is indexed *in another
process*, because `EdgeShard.optimize()` holds the GIL for its whole run:

1. start keeping what every write touched (`KeptWrites`), flush the shard and copy its
   directory to the next generation, `gen-<n+1>`, *while writes go on* (they land in the live
   shard and are noted); only the shard's own flushes wait for the copy;
2. `python -m agentmesh.memory.edge_indexer gen-<n+1>` optimizes the copy at low priority;
3. load the indexed copy and bring it up to date with what it missed, a chunk at a time
   between other work;
   with writes paused for the last few, point `CURRENT` at it (an atomic rename: a crash before
   leaves the old generation, which has every write, current), swap it in, close and delete the
   old one.

Why a copy taken while writes go on is sound: it is what a `kill -9` in the middle of the copy
would have left, file by file, with the write-ahead log copied last (so it holds at least what
the segments hold, as after a crash); Edge recovers such a directory by replaying its WAL, as it
does after a crash. Whatever the copy caught of the writes made during it, `KeptWrites` notes
all of them, in order, and bringing the copy up to date from them ends in the live shard's state
(see there). Writes used to wait for the copy: 6.2 s at 91k memories.

What is kept is the *ids* an upsert or delete touched, not the write: the copy takes each such
point as the live shard holds it when the catch-up reaches it. Keeping the writes themselves
(every vector and payload of a build's minutes of imports) held hundreds of MB in the service
while a build ran, and a build at 500k memories runs for many minutes (docs/memory.md).

Every call into Edge is made on the event-loop thread: `query` and `update` hold the GIL too
(measured), so a worker thread would add a hop without adding concurrency. Only flush, load,
close and file copies run on threads.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

import qdrant_edge as qe

from agentmesh.logs import get_logger

log = get_logger("agentmesh.memory.edge")

CURRENT = "CURRENT"
REPLAY_CHUNK = 64  # points (or other writes) brought up to date between two turns of the event loop
WAL = "wal"  # a shard directory's write-ahead log, copied last


def _generation_dir(root: Path, generation: int) -> Path:
    return root / f"gen-{generation:04d}"


def _read_current(root: Path) -> dict[str, Any]:
    return json.loads((root / CURRENT).read_text())


def _copy_shard(source: Path, target: Path) -> None:
    """Copy a shard directory that may be taking writes: everything but the WAL, then the WAL."""
    target.mkdir(parents=True)
    entries = sorted(source.iterdir(), key=lambda p: p.name == WAL)
    for entry in entries:
        if entry.is_dir():
            shutil.copytree(entry, target / entry.name)
        else:
            shutil.copy2(entry, target / entry.name)


def _write_current(root: Path, state: dict[str, Any]) -> None:
    tmp = root / f"{CURRENT}.tmp"
    with open(tmp, "w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / CURRENT)
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class KeptWrites:
    """What the writes to a shard touched while a build indexes a copy of it, in order.

    An upsert or a delete by ids is noted as its ids; any other write (a delete by filter, a
    payload index) as itself — those carry no vectors. `catch_up` brings the copy up to date:
    it goes through the notes in order, applying a kept write as it is and setting each noted id
    to what the live shard holds *at that moment* (the point, or its absence). Why that ends in
    the live shard's state, for any point P: if P was noted, its last note sets it to the live
    state, and the only writes after that note that can touch P are kept deletes by filter, which
    the live state already reflects and which, deleting only, change nothing when applied again;
    if P was never noted, only kept writes touched it, and they are applied in order onto a copy
    that holds some prefix of them (a crash-consistent copy), as deletes again idempotent.
    """

    def __init__(self) -> None:
        # (ids, None) for an upsert or delete by ids, (None, write) for any other write.
        self._notes: list[tuple[list[str] | None, qe.UpdateOperation | None]] = []
        self._next = 0  # the first note not yet applied to the copy
        self._ids_done = 0  # of that note's ids, how many are applied

    def note(self, operation: qe.UpdateOperation, touched: list[str] | None) -> None:
        self._notes.append((list(touched), None) if touched is not None else (None, operation))

    def pending(self) -> int:
        return len(self._notes) - self._next

    def catch_up(self, live: qe.EdgeShard, copy: qe.EdgeShard, budget: int | None) -> None:
        """Apply notes to `copy` until `budget` points or writes are done (None: all of them)."""
        while self._next < len(self._notes) and (budget is None or budget > 0):
            ids, operation = self._notes[self._next]
            if ids is None:
                assert operation is not None
                copy.update(operation)
                spent = 1
            else:
                take = len(ids) - self._ids_done if budget is None else min(budget, len(ids) - self._ids_done)
                chunk = ids[self._ids_done : self._ids_done + take]
                _mirror(live, copy, chunk)
                self._ids_done += take
                spent = take
                if self._ids_done < len(ids):
                    budget = 0 if budget is not None else None
                    continue
            self._notes[self._next] = ([], None)  # let it go
            self._next += 1
            self._ids_done = 0
            if budget is not None:
                budget -= spent


def _mirror(live: qe.EdgeShard, copy: qe.EdgeShard, ids: list[str]) -> None:
    """Set each of `ids` in `copy` to what `live` holds: the same point, or none."""
    found = live.retrieve(list(ids), True, True)
    if found:
        copy.update(qe.UpdateOperation.upsert_points([qe.Point(r.id, r.vector or {}, r.payload) for r in found]))
    present = {str(r.id) for r in found}
    gone: list[Any] = [i for i in ids if i not in present]
    if gone:
        copy.update(qe.UpdateOperation.delete_points(gone))


class IndexedShard:
    """One Edge shard under `root` (`CURRENT` + `gen-NNNN/`), with index builds off-process."""

    def __init__(self, root: Path, shard: qe.EdgeShard, state: dict[str, Any], index_after: int,
                 build_slot: asyncio.Semaphore | None = None):
        self.root = root
        self.name = root.name  # in logs: the namespace's directory, and the part's (edge_parts.py)
        self.shard = shard
        self._state = state  # {"generation": n, "indexed_points": points at the last build}
        self._index_after = index_after
        self.write_lock = asyncio.Lock()
        # Flushes and a build's copy of the files exclude each other (writes need neither).
        self._files_lock = asyncio.Lock()
        self._kept: KeptWrites | None = None  # while a build runs
        self._build: asyncio.Task | None = None
        self._process: asyncio.subprocess.Process | None = None
        self.dirty = False
        self._closing = False
        self._copied_points: int | None = None  # points in the running build's copy
        self.builds = 0  # finished index builds (tests and benches watch it)
        self.held_writes_s = 0.0  # time writes waited for a build (admit), in all
        self.copying = False  # a build is copying the shard's files (tests watch it)
        # A sealed part of a namespace (edge_parts.py) takes no new memories: whatever it holds
        # unindexed gets built, however few, so that no search brute-forces it from then on.
        self.sealed = False
        # Builds that share it run one at a time: a build needs free disk for its copy, and one
        # copy at a time bounds that by the largest shard (a part) instead of their sum.
        self._build_slot = build_slot
        self._waiting_for_slot = False

    # ------------------------------------------------------------------ open / create

    @classmethod
    def open_or_create(cls, root: Path, config: Callable[[], qe.EdgeConfig], index_after: int,
                       reconfigure: bool = False, build_slot: asyncio.Semaphore | None = None) -> "IndexedShard":
        """`reconfigure`: load an existing shard with `config` too, so that a shard created by an
        older version gets today's settings (memory placement) for the segments built from now on."""
        if (root / CURRENT).exists():
            state = _read_current(root)
            current = _generation_dir(root, state["generation"])
            for stale in root.glob("gen-*"):
                if stale != current:  # a build that a crash or stop interrupted
                    shutil.rmtree(stale, ignore_errors=True)
            shard = qe.EdgeShard.load(str(current), config() if reconfigure else None)
        else:
            root.mkdir(parents=True, exist_ok=True)
            state = {"generation": 1, "indexed_points": 0}
            shutil.rmtree(_generation_dir(root, 1), ignore_errors=True)
            shard = qe.EdgeShard.create(str(_generation_dir(root, 1)), config())
            _write_current(root, state)
        return cls(root, shard, state, index_after, build_slot)

    # ------------------------------------------------------------------ writes

    def update(self, operation: qe.UpdateOperation, touched: list[str] | None = None) -> None:
        """Apply a write (durable in the WAL when this returns); note it for a running build.

        `touched`: the ids of the points an upsert or a delete by ids writes, so that a build
        notes them instead of keeping the write (its vectors) in memory; None for other writes."""
        self.shard.update(operation)
        self.dirty = True
        if self._kept is not None:
            self._kept.note(operation, touched)

    async def admit(self) -> None:
        """Before a write: wait while the writes since the running build's copy are more than
        `index_after` — they sit in the appendable segment (~1.3 KB of heap a memory, its vectors
        in written pages) and the catch-up must apply each of them again. Without this, a bulk
        import faster than builds (a 1M fill on two busy cores) grew the appendable segment
        without bound: 300k memories behind, 2 GB RSS. The wait ends when the build swaps in;
        the next build's copy starts then, and writes go on. Writes at the speed of a person or
        an agent never get here: it takes `index_after` writes during one build."""
        started = None
        while (
            self._build is not None and self._copied_points is not None and self._index_after > 0
            and self.shard.info().points_count - self._copied_points > self._index_after
        ):
            started = started or time.monotonic()
            await asyncio.shield(self._build)
        if started is not None:
            self.held_writes_s += time.monotonic() - started

    def maybe_index(self) -> None:
        if self._index_after <= 0 or self._build is not None:
            return
        threshold = 1 if self.sealed else self._index_after
        if self.shard.info().points_count - self._state["indexed_points"] >= threshold:
            self._build = asyncio.create_task(self._build_in_turn())

    @property
    def indexing(self) -> bool:
        return self._build is not None

    async def flush(self) -> None:
        # Not while a build copies the shard's files: it must not copy them half-flushed.
        async with self._files_lock:
            if self.dirty:
                self.dirty = False
                await asyncio.to_thread(self.shard.flush)

    # ------------------------------------------------------------------ index builds

    async def _build_in_turn(self) -> None:
        if self._build_slot is None:
            return await self._build_index()
        self._waiting_for_slot = True
        try:
            await self._build_slot.acquire()
        finally:
            self._waiting_for_slot = False
        try:
            await self._build_index()
        finally:
            self._build_slot.release()

    async def _build_index(self) -> None:
        if self._closing:
            self._build = None
            return
        target = _generation_dir(self.root, self._state["generation"] + 1)
        started = time.monotonic()
        indexed: qe.EdgeShard | None = None
        swapped_in = False
        log.info("memory shard indexing", shard=self.name, generation=self._state["generation"] + 1)
        try:
            current = _generation_dir(self.root, self._state["generation"])
            async with self._files_lock:
                self.copying = True
                try:
                    # Noted from here on: the copy may miss any write made after this point.
                    self._kept = KeptWrites()
                    points = self._copied_points = self.shard.info().points_count
                    await asyncio.to_thread(self.shard.flush)
                    shutil.rmtree(target, ignore_errors=True)
                    try:
                        await asyncio.to_thread(_copy_shard, current, target)
                    except OSError as exc:
                        # A file Edge replaced mid-copy: copy again with writes paused, as before.
                        log.warning("memory shard copy raced a write; copying with writes paused",
                                    shard=self.name, reason=str(exc))
                        async with self.write_lock:
                            shutil.rmtree(target, ignore_errors=True)
                            await asyncio.to_thread(_copy_shard, current, target)
                finally:
                    self.copying = False
            copied = time.monotonic()
            if self._closing:
                raise RuntimeError("the service is stopping")
            self._process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "agentmesh.memory.edge_indexer", str(target),
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            )
            if self._closing:
                self._process.kill()
            _, err = await self._process.communicate()
            if self._process.returncode != 0:
                raise RuntimeError(f"the index build exited with {self._process.returncode}: {err.decode()[-500:]}")
            # Catch the indexed copy up while writes go on (they keep being noted), yielding
            # between chunks; only the last few are applied with writes paused. What is applied
            # goes through the copy's WAL, so it needs no flush to be durable.
            loading = time.monotonic()
            # Edge's load holds the GIL: the service stands still for this long (the swap's stall).
            indexed = await asyncio.to_thread(qe.EdgeShard.load, str(target))
            loaded = time.monotonic()
            kept = self._kept
            assert kept is not None
            while kept.pending() > 1:
                kept.catch_up(self.shard, indexed, REPLAY_CHUNK)
                await asyncio.sleep(0)
            swap_started = time.monotonic()
            async with self.write_lock:
                kept.catch_up(self.shard, indexed, None)
                state = {"generation": self._state["generation"] + 1, "indexed_points": points}
                _write_current(self.root, state)
                old, self.shard, self._state, self._kept = self.shard, indexed, state, None
                swapped_in = True  # from here on `target` is the live generation: never discard it
            swapped = time.monotonic()
            await asyncio.to_thread(old.close)
            await asyncio.to_thread(shutil.rmtree, current, True)
            self.builds += 1
            log.info(
                "memory shard indexed",
                shard=self.name,
                points=points,
                copy_s=round(copied - started, 2),
                load_s=round(loaded - loading, 2),
                swap_s=round(swapped - swap_started, 2),
                writes_held_s=round(self.held_writes_s, 2),  # in all, since the service started
                total_s=round(time.monotonic() - started, 2),
            )
        except asyncio.CancelledError:
            if not swapped_in:
                self._discard(indexed, target)
            raise
        except Exception as exc:  # noqa: BLE001 - a failed build must not take the shard down: it serves unindexed, a later write retries
            if not swapped_in:
                self._discard(indexed, target)
                self._state["indexed_points"] = self.shard.info().points_count
            log.error("memory shard index build failed", shard=self.name, reason=str(exc))
        finally:
            self._process = None
            self._build = None
            self._copied_points = None
        # What arrived during a long build may already call for the next one: start it now
        # rather than at the next write, which may not come (a fill that ended, as in a bench),
        # leaving that many memories to brute force on every search.
        if swapped_in and not self._closing:
            self.maybe_index()

    def _discard(self, indexed: qe.EdgeShard | None, target: Path) -> None:
        self._kept = None
        if indexed is not None and indexed is not self.shard:
            indexed.close()
        shutil.rmtree(target, ignore_errors=True)

    async def wait_indexed(self) -> None:
        while self._build is not None:  # a build may start the next as it ends
            await asyncio.shield(self._build)

    # ------------------------------------------------------------------ close / drop

    async def close(self) -> None:
        self._closing = True
        if self._build is not None and self._waiting_for_slot:
            self._build.cancel()  # its turn had not come: nothing of it to undo
            try:
                await self._build
            except asyncio.CancelledError:
                pass
            self._build = None
        if self._build is not None:
            # Stop the indexer; the build then ends by itself (its copy discarded), or, when the
            # indexer had already finished, by swapping the indexed copy in. Cancelling it instead
            # could interrupt a thread still opening the copy.
            if self._process is not None and self._process.returncode is None:
                self._process.kill()
            try:
                await asyncio.shield(self._build)
            except Exception:  # noqa: BLE001 - the build logged its own failure; closing goes on
                pass
        await asyncio.to_thread(self.shard.flush)
        await asyncio.to_thread(self.shard.close)

    async def drop(self) -> None:
        """Close the shard and delete it from disk."""
        await self.close()
        await asyncio.to_thread(shutil.rmtree, self.root, True)
