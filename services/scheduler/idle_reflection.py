"""Idle reflection: the scheduler asks the gateway to reflect on every session that has been idle
for `idle_s` and has new transcript entries since its last reflection (docs/agent.md, "Reflection").

Only the leading instance sweeps, every `check_s`. Single-firing rests on a claim in SQLite (the
shared data directory, like the job store): in one transaction a session is claimed for its
current message count only if the row still holds what the sweeper read (compare-and-set), so two
instances that both think they lead reflect a stretch once. A stretch reflected successfully is
never claimed again; a failed one (the agent, the model or its output) is released with a backoff
(`retry_s`, doubling, at most an hour) and tried again — a session's turns never wait on it.
Sub-agent sessions are left out: their work is part of their parent's.

    sweeper = IdleReflections(ReflectionClaims(path), GatewaySessions(GatewayClient(channel)), clock, settings)
    await sweeper.sweep(now)        # the leader's loop calls this; returns how many it started
"""

from __future__ import annotations

import asyncio
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol, TypeVar

import grpc

from agentmesh.clients.gateway import GatewayClient
from agentmesh.ids import PARENT_SESSION_LABEL
from agentmesh.logs import get_logger
from agentmesh.v1 import learning_pb2, sessions_pb2

log = get_logger("agentmesh.scheduler.reflection")
T = TypeVar("T")
MAX_BACKOFF_S = 3600.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS idle_reflections (
    session_id TEXT PRIMARY KEY,
    claimed_count INTEGER NOT NULL,  -- the message count a sweeper claimed
    claimed_at REAL NOT NULL,        -- 0: not held
    done_count INTEGER NOT NULL,     -- the message count last reflected on
    attempts INTEGER NOT NULL,       -- failures in a row
    next_attempt_at REAL NOT NULL,
    last_error TEXT NOT NULL
);
"""


@dataclass(frozen=True)
class IdleSettings:
    idle_s: float = 600.0  # 0: idle reflection off
    check_s: float = 60.0
    retry_s: float = 300.0
    hold_s: float = 600.0  # a claim older than this (its sweeper died) may be taken over


@dataclass(frozen=True)
class SessionView:
    session_id: str
    updated_at: float
    message_count: int
    is_subagent: bool


class Sessions(Protocol):
    async def list(self) -> list[SessionView]: ...
    async def reflect(self, session_id: str) -> tuple[bool, str]:
        """(succeeded, error) of one idle reflection."""


class ReflectionClaims:
    """The claims table, on one worker thread that owns the connection."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reflection-claims")
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10.0)
        self._db.execute("PRAGMA journal_mode=wal")
        self._db.executescript(_SCHEMA)

    async def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, self._db)

    async def claim(self, session_id: str, count: int, now: float, hold_s: float) -> bool:
        """Take the session's stretch up to `count` unless it is done, held, or backing off."""

        def claim(db: sqlite3.Connection) -> bool:
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute("SELECT claimed_count, claimed_at, done_count, next_attempt_at FROM idle_reflections "
                                 "WHERE session_id = ?", (session_id,)).fetchone()
                if row is None:
                    db.execute("INSERT INTO idle_reflections VALUES (?, ?, ?, 0, 0, 0, '')", (session_id, count, now))
                    db.execute("COMMIT")
                    return True
                claimed_count, claimed_at, done_count, next_attempt_at = row
                if done_count >= count or next_attempt_at > now or (claimed_at and now - claimed_at < hold_s):
                    db.execute("COMMIT")
                    return False
                moved = db.execute("UPDATE idle_reflections SET claimed_count = ?, claimed_at = ? "
                                   "WHERE session_id = ? AND claimed_count = ? AND claimed_at = ?",
                                   (count, now, session_id, claimed_count, claimed_at)).rowcount
                db.execute("COMMIT")
                return bool(moved)
            except BaseException:
                db.execute("ROLLBACK")
                raise

        return await self._call(claim)

    async def finish(self, session_id: str, count: int, ok: bool, error: str, now: float, retry_s: float) -> None:
        def finish(db: sqlite3.Connection) -> None:
            if ok:
                db.execute("UPDATE idle_reflections SET done_count = ?, claimed_at = 0, attempts = 0, "
                           "next_attempt_at = 0, last_error = '' WHERE session_id = ?", (count, session_id))
                return
            (attempts,) = db.execute("SELECT attempts FROM idle_reflections WHERE session_id = ?",
                                     (session_id,)).fetchone()
            backoff = min(retry_s * 2 ** attempts, MAX_BACKOFF_S)
            db.execute("UPDATE idle_reflections SET claimed_at = 0, attempts = attempts + 1, next_attempt_at = ?, "
                       "last_error = ? WHERE session_id = ?", (now + backoff, error[:500], session_id))

        await self._call(finish)

    async def close(self) -> None:
        await self._call(lambda db: db.close())
        self._executor.shutdown(wait=True)


class GatewaySessions:
    """Sessions listed, and reflections asked for, through the gateway (as the scheduler)."""

    def __init__(self, gateway: GatewayClient):
        self._stub = gateway.stub

    async def list(self) -> list[SessionView]:
        found: list[SessionView] = []
        token = ""
        while True:
            page = await self._stub.ListSessions(sessions_pb2.ListSessionsRequest(page_size=500, page_token=token),
                                                 timeout=30)
            found += [SessionView(s.session_id, s.updated_at, s.message_count, PARENT_SESSION_LABEL in s.labels)
                      for s in page.sessions]
            token = page.next_page_token
            if not token:
                return found

    async def reflect(self, session_id: str) -> tuple[bool, str]:
        try:
            reply = await self._stub.Reflect(learning_pb2.ReflectRequest(session_id=session_id, trigger="idle"),
                                             timeout=330)
        except grpc.aio.AioRpcError as err:
            return False, f"{err.code().name}: {err.details()}"
        return reply.run.status != "failed", reply.run.error


class IdleReflections:
    def __init__(self, claims: ReflectionClaims, sessions: Sessions, settings: IdleSettings):
        self._claims = claims
        self._sessions = sessions
        self._settings = settings

    async def sweep(self, now: float) -> int:
        s = self._settings
        try:
            listed = await self._sessions.list()
        except grpc.aio.AioRpcError as err:
            log.warning("idle reflection: sessions unavailable", error=err.details())
            return 0
        started = 0
        for session in listed:
            if session.is_subagent or not session.message_count or now - session.updated_at < s.idle_s:
                continue
            if not await self._claims.claim(session.session_id, session.message_count, now, s.hold_s):
                continue
            started += 1
            ok, error = await self._sessions.reflect(session.session_id)
            if not ok:
                log.warning("idle reflection failed; will retry", session_id=session.session_id, error=error)
            await self._claims.finish(session.session_id, session.message_count, ok, error, now, s.retry_s)
        return started


class Sweeper(Protocol):
    """What the leader's loop runs: the idle reflections, the retention sweep."""

    async def sweep(self, now: float) -> int: ...


async def run_while_leading(sweeper: Sweeper, is_leader: Callable[[], bool], clock: Callable[[], float],
                            check_s: float, stopping: asyncio.Event) -> None:
    """The sweep loop: every `check_s`, on the leading instance only. A sweep's failure is logged
    and the loop goes on."""
    while not stopping.is_set():
        try:
            await asyncio.wait_for(stopping.wait(), check_s)
            return
        except TimeoutError:
            pass
        if not is_leader():
            continue
        try:
            await sweeper.sweep(clock())
        except Exception:
            log.exception("idle reflection sweep failed")


