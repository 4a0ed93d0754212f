"""Reading a turn's events in tests: collect a stream, pick events by kind, and a turn read in
the background so a test can act (cancel, approve, chat again) while it runs."""

from __future__ import annotations

import asyncio

from agentmesh.v1 import gateway_pb2
from tests.support.timing import PATIENCE_S


async def collect(call) -> list:
    return [event async for event in call]


def kinds(events) -> list[str]:
    return [e.WhichOneof("payload") for e in events]


def of_kind(events, kind: str) -> list:
    return [getattr(e, kind) for e in events if e.WhichOneof("payload") == kind]


async def wait_until(predicate, timeout: float = PATIENCE_S, interval: float = 0.05) -> None:
    """Poll `predicate` until it is true; past `timeout` (generous: tests/support/timing.py) it fails."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(interval)


class LiveTurn:
    """A Chat stream read in the background, so the test can act while the turn waits."""

    def __init__(self, gateway, session_id: str, message: str, metadata=(), **options):
        request = gateway_pb2.ChatRequest(session_id=session_id, message=message,
                                          options=gateway_pb2.ChatOptions(**options))
        self.call = gateway.Chat(request, timeout=3 * PATIENCE_S, metadata=metadata)
        self.events: list = []
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for event in self.call:
            self.events.append(event)

    def of_kind(self, kind: str) -> list:
        return of_kind(self.events, kind)

    async def approval_request(self, index: int = 0):
        await wait_until(lambda: len(self.of_kind("approval_request")) > index)
        return self.of_kind("approval_request")[index]

    async def finished(self) -> list:
        await asyncio.wait_for(self.task, PATIENCE_S)
        return self.events
