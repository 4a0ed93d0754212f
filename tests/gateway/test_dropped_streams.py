"""A client that drops its event stream is not an error of the gateway's, whenever it happens."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
from httpx_sse import aconnect_sse

from tests.observability.obs_helpers import capture_logs
from tests.support.llm_server import ScriptedLLMServer, reply
from tests.support.stack import Stack


async def llm_paused(llm) -> None:
    await asyncio.to_thread(llm.wait_for_requests, 1)
    await asyncio.sleep(0.5)  # its first chunks sent, it pauses


async def test_a_stream_dropped_before_the_gateway_stops_logs_no_error(tmp_path):
    # The model pauses mid-answer, so the turn still runs when the client goes and when the
    # gateway stops (and interrupts it).
    slow = reply("slow " * 50, chunk_chars=2, pause_after_chunks=3, pause_s=5)
    with ScriptedLLMServer(default=slow) as llm, capture_logs("gateway") as logs:
        stack = await Stack(tmp_path / "home", llm_base_url=llm.base_url).start()
        try:
            async with httpx.AsyncClient(base_url=stack.http_url, timeout=30) as client:
                started = asyncio.Event()

                async def read() -> None:
                    async with aconnect_sse(client, "POST", "/v1/sessions/s1/chat", json={"message": "hi"}) as source:
                        async for _ in source.aiter_sse():
                            started.set()

                reader = asyncio.ensure_future(read())
                await asyncio.wait_for(started.wait(), 30)
                await llm_paused(llm)
                reader.cancel()  # the client goes away mid-turn
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
                await asyncio.sleep(0.5)
                await stack.stop()  # the gateway drains, interrupting the turn whose stream was dropped
        finally:
            await stack.stop()
    errors = [line for line in logs.lines()
              if line.get("level") in ("error", "critical") and line.get("logger", "").startswith("agentmesh.gateway")]
    assert errors == []
