"""A model's concurrency limit: at most `max_concurrency` calls to it at once, the rest waiting
in the open.

A limit has to be somewhere — a connection pool, a server's own queue, the provider's rate
limit — and where it was hidden (httpx's pool of 100 connections, a constant) it queued turns
that nobody could see or configure. Here it is the model's setting (`max_concurrency` in its
AGENTMESH_MODELS entry, AGENTMESH_LLM_MAX_CONCURRENCY for the default model and as the
default), a call that must wait says so in its turn's stream (`WaitingForSlot`, a `status`
event) and in metrics (`agentmesh.model.slot.waiting`, `agentmesh.model.slot.wait`), and the
HTTP pool is sized to the limit (`pool_limits`) so that it never queues a call itself.

A slot is held for the whole call, its retries and backoff included: a model answering 429 is
sent no more calls at once than before.
"""

from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator

import httpx

from agentmesh.agent.providers.base import ModelProvider, closing
from agentmesh.agent.types import ModelEvent, ModelRequest, WaitingForSlot
from agentmesh.telemetry.instruments import ServiceMetrics

__all__ = ["ModelSlots", "SlotLimited", "pool_limits"]

# Idle connections kept for reuse beyond which a burst's are closed (httpx keeps them 5 s): a
# burst of calls to a model is usually followed by another, and a new connection costs a TCP
# (and TLS) handshake; past this many an idle connection costs more in descriptors than it saves.
MAX_KEEPALIVE = 1024


def pool_limits(max_concurrency: int) -> httpx.Limits:
    """The HTTP pool of a model with this limit (0: none): as many connections as slots, so a call
    holding a slot never waits for a connection — the only wait is the visible one."""
    if max_concurrency <= 0:
        return httpx.Limits(max_connections=None, max_keepalive_connections=MAX_KEEPALIVE)
    return httpx.Limits(max_connections=max_concurrency,
                        max_keepalive_connections=min(max_concurrency, MAX_KEEPALIVE))


class ModelSlots:
    """The slots of one model (`name`: its catalogue name); `limit` 0 means no limit."""

    def __init__(self, name: str, limit: int, metrics: ServiceMetrics | None = None):
        self.name = name
        self.limit = limit
        self.waiting = 0
        self._metrics = metrics
        self._free = asyncio.Semaphore(limit) if limit > 0 else None

    def free_now(self) -> bool:
        """A slot can be taken without waiting (nobody is queued ahead either)."""
        return self._free is None or not self._free.locked()

    async def acquire(self) -> None:
        """Take a slot, waiting as long as it takes; the wait is counted and timed."""
        if self._free is None:
            return
        if not self._free.locked():
            await self._free.acquire()  # free: returns without suspending
            if self._metrics is not None:
                self._metrics.record_model_slot_wait(self.name, 0.0)
            return
        started = time.monotonic()
        self.waiting += 1
        if self._metrics is not None:
            self._metrics.model_slot_waiting_add(self.name, 1)
        try:
            await self._free.acquire()
        finally:
            self.waiting -= 1
            if self._metrics is not None:
                self._metrics.model_slot_waiting_add(self.name, -1)
        if self._metrics is not None:
            self._metrics.record_model_slot_wait(self.name, time.monotonic() - started)

    def release(self) -> None:
        if self._free is not None:
            self._free.release()


class SlotLimited:
    """A provider whose calls each hold one of `slots` while they run."""

    def __init__(self, inner: ModelProvider, slots: ModelSlots):
        self.inner = inner
        self.slots = slots
        self.name = inner.name

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        slots = self.slots
        if not slots.free_now():
            # Said before the wait, so the turn's stream explains the pause while it lasts.
            yield WaitingForSlot(model=slots.name, limit=slots.limit, waiting=slots.waiting + 1)
        await slots.acquire()
        try:
            # Closed here, not when collected: its connection goes back to the pool before the
            # slot does, so the pool (sized to the slots) never makes a call wait.
            async with closing(self.inner.stream(request)) as events:
                async for event in events:
                    yield event
        finally:
            slots.release()
