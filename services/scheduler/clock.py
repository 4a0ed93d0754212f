"""Time, injectable: the engine asks a Clock for the time and to sleep, so tests drive a fake
one through days of schedule in milliseconds."""

from __future__ import annotations

import asyncio
import time


class SystemClock:
    def now(self) -> float:
        return time.time()

    async def sleep_until(self, deadline: float) -> None:
        # The loop sleeps in short caps anyway (poll interval), so a wall-clock step is
        # noticed quickly even though asyncio sleeps on the monotonic clock.
        delay = deadline - time.time()
        await asyncio.sleep(max(0.0, delay))
