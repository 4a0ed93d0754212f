"""The narrow interfaces the scheduler core depends on: time, leadership, and where runs go.
`clock.py`, `leader.py` and `gateway_target.py` implement them; tests drive fakes of each."""

from __future__ import annotations

from typing import Awaitable, Callable, Protocol

from agentmesh.scheduler.model import RunOutcome, RunRequest

__all__ = ["Clock", "LeaderLock", "RunTarget"]


class Clock(Protocol):
    def now(self) -> float:
        """Unix seconds."""

    async def sleep_until(self, deadline: float) -> None:
        """Return once now() >= deadline (or soon after)."""


class LeaderLock(Protocol):
    async def acquire(self, now: float) -> bool: ...

    async def release(self) -> None: ...


class RunTarget(Protocol):
    """Where runs go: the gateway in production (see gateway_target.py)."""

    async def run(self, request: RunRequest, on_started: Callable[[str, str], Awaitable[None]]) -> RunOutcome: ...

    async def cancel(self, session_id: str) -> None: ...
