"""Idle reflection's claims: two sweepers that both think they lead, on one shared database,
reflect a stretch once; a failure backs off, then is retried; a done stretch is never claimed
again, even by a sweeper started afresh on the same file (a restart)."""

from __future__ import annotations

import asyncio

from agentmesh.scheduler.idle_reflection import IdleReflections, IdleSettings, ReflectionClaims, SessionView


class Sessions:
    """The gateway as the sweeper sees it: a fixed session list, and a log of reflections asked."""

    def __init__(self, *sessions: SessionView, fail_first: int = 0):
        self.sessions = list(sessions)
        self.reflected: list[str] = []
        self._fail = fail_first

    async def list(self):
        return self.sessions

    async def reflect(self, session_id: str):
        await asyncio.sleep(0.05)  # long enough for a concurrent sweep to try the same session
        self.reflected.append(session_id)
        if self._fail:
            self._fail -= 1
            return False, "model down"
        return True, ""


SETTINGS = IdleSettings(idle_s=10, check_s=1, retry_s=5)


async def test_two_leaders_reflect_a_stretch_once(tmp_path):
    path = tmp_path / "reflections.db"
    sessions = Sessions(SessionView("s1", updated_at=0, message_count=4, is_subagent=False),
                        SessionView("busy", updated_at=95, message_count=2, is_subagent=False),
                        SessionView("s1.sub-1", updated_at=0, message_count=3, is_subagent=True))
    a, b = ReflectionClaims(path), ReflectionClaims(path)
    try:
        started = await asyncio.gather(IdleReflections(a, sessions, SETTINGS).sweep(100),
                                       IdleReflections(b, sessions, SETTINGS).sweep(100))
        assert sorted(started) == [0, 1] and sessions.reflected == ["s1"]  # not busy (not idle), not the sub-agent
        assert await IdleReflections(a, sessions, SETTINGS).sweep(101) == 0  # s1 is done
    finally:
        await a.close()
        await b.close()
    restarted = ReflectionClaims(path)
    try:
        assert await IdleReflections(restarted, sessions, SETTINGS).sweep(300) == 1  # only "busy", now idle
        sessions.sessions[0] = SessionView("s1", updated_at=250, message_count=6, is_subagent=False)
        assert await IdleReflections(restarted, sessions, SETTINGS).sweep(300) == 1  # s1's new entries
        assert sessions.reflected == ["s1", "busy", "s1"]
    finally:
        await restarted.close()


async def test_a_failure_backs_off_then_is_retried(tmp_path):
    sessions = Sessions(SessionView("s1", updated_at=0, message_count=4, is_subagent=False), fail_first=2)
    claims = ReflectionClaims(tmp_path / "reflections.db")
    sweeper = IdleReflections(claims, sessions, SETTINGS)
    try:
        assert await sweeper.sweep(100) == 1            # fails: retry after 5 s
        assert await sweeper.sweep(104) == 0
        assert await sweeper.sweep(105) == 1            # fails again: retry after 10 s
        assert await sweeper.sweep(114) == 0
        assert await sweeper.sweep(115) == 1            # succeeds
        assert await sweeper.sweep(1000) == 0
        assert sessions.reflected == ["s1", "s1", "s1"]
    finally:
        await claims.close()
