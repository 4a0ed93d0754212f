"""Waiting in tests: for a condition, never for a time.

A test waits until what it expects has happened, polling with a generous overall bound (a
liveness bound, not a timing assertion): on a machine whose cores are busy with other work a
service may take many times its idle time to answer, and a test must still pass. How fast
something happens is a benchmark's to measure (benches/, docs/benchmarks.md), never a test's.
`AGENTMESH_TEST_PATIENCE_S` changes the bound (default 60 s).
"""

from __future__ import annotations

import asyncio
import os
from typing import AsyncIterator

PATIENCE_S = float(os.environ.get("AGENTMESH_TEST_PATIENCE_S", "60"))


async def polling(interval_s: float = 0.05, timeout_s: float = PATIENCE_S) -> AsyncIterator[int]:
    """Attempts 0, 1, 2, … `interval_s` apart until `timeout_s` has passed; the loop's `else`
    (or the assertion after it) says what never happened."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    attempt = 0
    while True:
        yield attempt
        attempt += 1
        if loop.time() >= deadline:
            return
        await asyncio.sleep(interval_s)
