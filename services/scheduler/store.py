"""Durable jobs and run history in SQLite (stdlib `sqlite3`).

Why SQLite: the scheduler has one active instance, needs transactions and a unique constraint
to make firing idempotent, and must start with nothing but a data directory. The memory service
(Qdrant) has neither transactions nor unique keys. Every replica opens the same database file
(the data directory is shared; see docs/scheduler.md), so the API works on any replica.

Single-firing rests on `claim`: in one transaction the job's `next_run_at` moves on only if it
still holds the value the caller read (compare-and-set) and the run row is inserted under the
unique key (job_id, scheduled_for). Two instances that both think they lead still fire once.

All calls run on one worker thread that owns the connection, so the event loop never blocks
on disk and the connection is never shared between threads.
"""

from __future__ import annotations

import asyncio
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from dataclasses import astuple, dataclass, fields
from pathlib import Path
from typing import Any, Callable, TypeVar

from agentmesh.errors import AlreadyExists, ResourceExhausted
from agentmesh.scheduler.model import Job, Run

T = TypeVar("T")

_JOB_COLUMNS = tuple(f.name for f in fields(Job))
_RUN_COLUMNS = tuple(f.name for f in fields(Run))

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY, name TEXT NOT NULL, schedule TEXT NOT NULL, prompt TEXT NOT NULL,
    session_id TEXT NOT NULL, mode TEXT NOT NULL, enabled INTEGER NOT NULL, timezone TEXT NOT NULL,
    concurrency_policy TEXT NOT NULL, missed_run_policy TEXT NOT NULL,
    created_at REAL NOT NULL, updated_at REAL NOT NULL, anchor_at REAL NOT NULL,
    next_run_at REAL NOT NULL, last_run_at REAL NOT NULL,
    created_by TEXT NOT NULL DEFAULT '', created_by_tenant TEXT NOT NULL DEFAULT '',
    if_busy TEXT NOT NULL DEFAULT '', plan TEXT NOT NULL DEFAULT '',
    run_at REAL NOT NULL DEFAULT 0, done_at REAL NOT NULL DEFAULT 0, source TEXT NOT NULL DEFAULT '',
    agent TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS jobs_due ON jobs (next_run_at) WHERE enabled = 1 AND next_run_at > 0;
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, job_id TEXT NOT NULL, status TEXT NOT NULL, scheduled_for REAL NOT NULL,
    started_at REAL NOT NULL, finished_at REAL NOT NULL, session_id TEXT NOT NULL, trace_id TEXT NOT NULL,
    summary TEXT NOT NULL, error TEXT NOT NULL, trigger TEXT NOT NULL, owner TEXT NOT NULL
);
-- The idempotency key: one run per job and due time. Manual runs are not due times.
CREATE UNIQUE INDEX IF NOT EXISTS runs_once ON runs (job_id, scheduled_for) WHERE trigger != 'manual';
CREATE INDEX IF NOT EXISTS runs_by_job ON runs (job_id, started_at);
CREATE INDEX IF NOT EXISTS runs_running ON runs (job_id) WHERE status = 'running';
CREATE TABLE IF NOT EXISTS instances (instance_id TEXT PRIMARY KEY, seen_at REAL NOT NULL);
"""


@dataclass(frozen=True)
class Claim:
    job_id: str
    expected_next: float
    new_next: float
    run: Run
    ran: bool = True  # False for a skipped run: last_run_at stays
    done: bool = False  # the last due time of a one-off job: it is done once claimed


def _job(row: tuple) -> Job:
    job = Job(*row)
    job.enabled = bool(job.enabled)
    return job


class SqliteStore:
    def __init__(self, path: Path, journal_mode: str = "wal", max_jobs: int = 100_000):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._max_jobs = max_jobs
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="scheduler-store")
        # isolation_level=None: we issue BEGIN ourselves, so each transaction is explicit.
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10.0)
        self._db.execute(f"PRAGMA journal_mode={journal_mode}")
        # Containers run with a read-only root filesystem: never spill temp tables to /tmp.
        self._db.execute("PRAGMA temp_store=MEMORY")
        self._db.execute("PRAGMA synchronous=NORMAL" if journal_mode == "wal" else "PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        self._add_missing_columns()

    def _add_missing_columns(self) -> None:
        """A database made by an earlier version lacks the newer job columns: add them (empty)."""
        present = {row[1] for row in self._db.execute("PRAGMA table_info(jobs)")}
        # In the order of the Job record: rows are read positionally.
        for column, kind in (("created_by", "TEXT"), ("created_by_tenant", "TEXT"), ("if_busy", "TEXT"),
                             ("plan", "TEXT"), ("run_at", "REAL"), ("done_at", "REAL"), ("source", "TEXT"),
                             ("agent", "TEXT")):
            if column not in present:
                default = "''" if kind == "TEXT" else "0"
                self._db.execute(f"ALTER TABLE jobs ADD COLUMN {column} {kind} NOT NULL DEFAULT {default}")

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _transaction(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        # IMMEDIATE takes the write lock up front, so two replicas serialize instead of deadlocking.
        self._db.execute("BEGIN IMMEDIATE")
        try:
            result = fn(self._db)
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")
        return result

    async def close(self) -> None:
        await self._call(self._db.close)
        self._executor.shutdown(wait=True)

    # --- jobs -----------------------------------------------------------------------------

    async def create_job(self, job: Job) -> None:
        def create(db: sqlite3.Connection) -> None:
            if db.execute("SELECT 1 FROM jobs WHERE job_id = ?", (job.job_id,)).fetchone():
                raise AlreadyExists(f"a job with id {job.job_id!r} already exists")
            (count,) = db.execute("SELECT COUNT(*) FROM jobs").fetchone()
            if count >= self._max_jobs:
                raise ResourceExhausted(f"the scheduler holds its maximum of {self._max_jobs} jobs; delete some first")
            db.execute(f"INSERT INTO jobs VALUES ({','.join('?' * len(_JOB_COLUMNS))})", astuple(job))

        await self._call(self._transaction, create)

    async def put_job(self, job: Job, retimed: bool = True) -> None:
        """Save an edit. The firing path owns last_run_at, and next_run_at unless the edit moved
        the job onto a new timetable, so an edit racing a firing never rolls either back (a new
        one-off time re-arms a done job: done_at goes with the timetable)."""
        kept = ("job_id", "created_at", "last_run_at", "created_by", "created_by_tenant", "source") + (
            () if retimed else ("next_run_at", "anchor_at", "done_at"))
        columns = [c for c in _JOB_COLUMNS if c not in kept]
        values = [getattr(job, c) for c in columns]
        sets = ", ".join(f"{c} = ?" for c in columns)
        await self._call(self._db.execute, f"UPDATE jobs SET {sets} WHERE job_id = ?", (*values, job.job_id))

    async def get_job(self, job_id: str) -> Job | None:
        def get() -> Job | None:
            row = self._db.execute("SELECT * FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
            return _job(row) if row else None

        return await self._call(get)

    async def list_jobs(self) -> list[Job]:
        def listing() -> list[Job]:
            return [_job(r) for r in self._db.execute("SELECT * FROM jobs ORDER BY created_at, job_id")]

        return await self._call(listing)

    async def delete_job(self, job_id: str) -> bool:
        def delete(db: sqlite3.Connection) -> bool:
            deleted = db.execute("DELETE FROM jobs WHERE job_id = ?", (job_id,)).rowcount
            db.execute("DELETE FROM runs WHERE job_id = ? AND status != 'running'", (job_id,))
            return bool(deleted)

        return await self._call(self._transaction, delete)

    async def due_jobs(self, now: float, limit: int = 500) -> list[Job]:
        def due() -> list[Job]:
            rows = self._db.execute(
                "SELECT * FROM jobs WHERE enabled = 1 AND next_run_at > 0 AND next_run_at <= ? "
                "ORDER BY next_run_at LIMIT ?",
                (now, limit),
            )
            return [_job(r) for r in rows]

        return await self._call(due)

    async def next_due_at(self) -> float | None:
        def earliest() -> float | None:
            (value,) = self._db.execute(
                "SELECT MIN(next_run_at) FROM jobs WHERE enabled = 1 AND next_run_at > 0"
            ).fetchone()
            return value

        return await self._call(earliest)

    # --- runs -----------------------------------------------------------------------------

    async def claim(self, job_id: str, expected_next: float, new_next: float, run: Run, ran: bool = True) -> bool:
        """Advance the job past `expected_next` and record `run`, atomically; False if another
        instance already did (the job moved on, or the run's due time is taken)."""
        (claimed,) = await self.claim_many([Claim(job_id, expected_next, new_next, run, ran)])
        return claimed

    async def claim_many(self, claims: list["Claim"]) -> list[bool]:
        """`claim` for a batch, in one transaction (one commit for a whole tick); each claim
        sits in its own savepoint, so one lost race does not undo the others."""

        def claim_all(db: sqlite3.Connection) -> list[bool]:
            results = []
            advance = ("UPDATE jobs SET next_run_at = ?, last_run_at = CASE WHEN ? THEN ? ELSE last_run_at END, "
                       "done_at = CASE WHEN ? THEN ? ELSE done_at END WHERE job_id = ? AND next_run_at = ?")
            for claim in claims:
                args = (claim.new_next, claim.ran, claim.run.started_at, claim.done, claim.run.started_at,
                        claim.job_id, claim.expected_next)
                db.execute("SAVEPOINT claim")
                try:
                    moved = db.execute(advance, args).rowcount
                    if moved:
                        db.execute(f"INSERT INTO runs VALUES ({','.join('?' * len(_RUN_COLUMNS))})", astuple(claim.run))
                    db.execute("RELEASE claim")
                    results.append(bool(moved))
                except sqlite3.IntegrityError:
                    # This due time already has its run, yet the job still points at it: move the
                    # job on anyway, or it would stay due and be retried forever.
                    db.execute("ROLLBACK TO claim")
                    db.execute("RELEASE claim")
                    db.execute(advance, (claim.new_next, False, 0.0, claim.done, claim.run.started_at, claim.job_id,
                                         claim.expected_next))
                    results.append(False)
            return results

        if not claims:
            return []
        return await self._call(self._transaction, claim_all)

    async def insert_run(self, run: Run, last_run_at: float) -> None:
        def insert(db: sqlite3.Connection) -> None:
            db.execute(f"INSERT INTO runs VALUES ({','.join('?' * len(_RUN_COLUMNS))})", astuple(run))
            db.execute("UPDATE jobs SET last_run_at = ? WHERE job_id = ?", (last_run_at, run.job_id))

        await self._call(self._transaction, insert)

    async def mark_started(self, run_id: str, session_id: str, trace_id: str) -> None:
        await self._call(
            self._db.execute,
            "UPDATE runs SET session_id = ?, trace_id = ? WHERE run_id = ?",
            (session_id, trace_id, run_id),
        )

    async def finish_run(self, run: Run, keep: int) -> None:
        """Record a run's end and prune the job's history to the newest `keep` runs."""

        def finish(db: sqlite3.Connection) -> None:
            db.execute(
                "UPDATE runs SET status = ?, finished_at = ?, session_id = ?, trace_id = ?, summary = ?, error = ? "
                "WHERE run_id = ?",
                (run.status, run.finished_at, run.session_id, run.trace_id, run.summary, run.error, run.run_id),
            )
            self._prune(db, run.job_id, keep)

        await self._call(self._transaction, finish)

    @staticmethod
    def _prune(db: sqlite3.Connection, job_id: str, keep: int) -> None:
        db.execute(
            "DELETE FROM runs WHERE job_id = ? AND status != 'running' AND run_id NOT IN "
            "(SELECT run_id FROM runs WHERE job_id = ? ORDER BY started_at DESC, scheduled_for DESC, rowid DESC LIMIT ?)",
            (job_id, job_id, keep),
        )

    async def prune(self, job_id: str, keep: int) -> None:
        await self._call(self._transaction, lambda db: self._prune(db, job_id, keep))

    async def list_runs(self, job_id: str, limit: int) -> list[Run]:
        def listing() -> list[Run]:
            where, args = ("WHERE job_id = ?", (job_id,)) if job_id else ("", ())
            rows = self._db.execute(
                f"SELECT * FROM runs {where} ORDER BY started_at DESC, scheduled_for DESC, rowid DESC LIMIT ?",
                (*args, limit),
            )
            return [Run(*r) for r in rows]

        return await self._call(listing)

    async def running_by_job(self, job_ids: list[str]) -> dict[str, list[Run]]:
        """Running runs of each of `job_ids` (absent: none), in one query."""

        def running() -> dict[str, list[Run]]:
            found: dict[str, list[Run]] = {}
            for start in range(0, len(job_ids), 500):  # SQLite's bound-parameter limit
                chunk = job_ids[start:start + 500]
                rows = self._db.execute(
                    f"SELECT * FROM runs WHERE status = 'running' AND job_id IN ({','.join('?' * len(chunk))})", chunk
                )
                for r in rows:
                    found.setdefault(r[1], []).append(Run(*r))
            return found

        return await self._call(running) if job_ids else {}

    async def running_runs(self, job_id: str) -> list[Run]:
        def running() -> list[Run]:
            rows = self._db.execute("SELECT * FROM runs WHERE job_id = ? AND status = 'running'", (job_id,))
            return [Run(*r) for r in rows]

        return await self._call(running)

    # --- liveness of instances ------------------------------------------------------------

    async def heartbeat(self, instance_id: str, now: float) -> None:
        await self._call(
            self._db.execute,
            "INSERT INTO instances VALUES (?, ?) ON CONFLICT (instance_id) DO UPDATE SET seen_at = excluded.seen_at",
            (instance_id, now),
        )

    async def forget_instance(self, instance_id: str) -> None:
        await self._call(self._db.execute, "DELETE FROM instances WHERE instance_id = ?", (instance_id,))

    async def fail_orphaned_runs(self, self_id: str, now: float, stale_before: float) -> int:
        """Runs left 'running' by an instance that stopped heart-beating (a crash) end as failed."""

        def sweep(db: sqlite3.Connection) -> int:
            orphaned = db.execute(
                "UPDATE runs SET status = 'failed', finished_at = ?, "
                "error = 'the scheduler instance running this stopped before the run finished' "
                "WHERE status = 'running' AND owner != ? AND owner NOT IN "
                "(SELECT instance_id FROM instances WHERE seen_at >= ?)",
                (now, self_id, stale_before),
            ).rowcount
            db.execute("DELETE FROM instances WHERE seen_at < ?", (stale_before,))
            return orphaned

        return await self._call(self._transaction, sweep)
