"""Idle reflection end to end: the scheduler reflects on a session that went idle, once; a
failure is retried later; nothing fires again after a restart of every service; new entries
get a reflection of their own. All five services over real gRPC, a scripted model server."""

from __future__ import annotations

import asyncio

from agentmesh.v1 import learning_pb2
from tests.e2e.conftest import chat
from tests.e2e.test_reflection import extraction
from tests.e2e.test_standing_instructions import session_in, user_memory_stub
from tests.support.llm_server import reply
from tests.support.stack import Stack

FAST = {"AGENTMESH_REFLECT_IDLE_S": "0.5", "AGENTMESH_REFLECT_CHECK_S": "0.2", "AGENTMESH_REFLECT_RETRY_S": "0.3"}


async def eventually(check, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "not reached in time"
        await asyncio.sleep(0.1)


async def runs(stack: Stack) -> list:
    reply_ = await user_memory_stub(stack).ListReflections(
        learning_pb2.ListReflectionsRequest(namespace="team-a"), timeout=10, wait_for_ready=True)
    return list(reversed(reply_.runs))  # oldest first


async def test_an_idle_session_is_reflected_once_retried_after_a_failure_and_not_again_after_a_restart(tmp_path, llm):
    stack = Stack(tmp_path / "home", llm_base_url=llm.base_url, env=FAST)
    await stack.start()
    try:
        gateway = stack.gateway_stub()
        await session_in(gateway, "idle", "team-a")
        llm.add(reply("Hello."), reply("not JSON at all"), extraction())
        await chat(gateway, "idle", "hi")

        async def settled() -> bool:
            return any(r.status == "done" for r in await runs(stack))

        await eventually(settled)
        await asyncio.sleep(1.5)  # several more sweeps: nothing new to reflect on
        first = await runs(stack)
        assert [(r.status, r.trigger, r.seq_from, r.seq_to) for r in first] == [
            ("failed", "idle", 1, 2), ("done", "idle", 1, 2)]
        assert first[1].added == 2

        await stack.restart()
        await asyncio.sleep(1.5)
        assert len(await runs(stack)) == 2  # the claims survived: the stretch is not reflected again

        gateway = stack.gateway_stub()
        llm.add(reply("Bye."), extraction())
        await chat(gateway, "idle", "bye")

        async def second_done() -> bool:
            return sum(r.status == "done" for r in await runs(stack)) == 2

        await eventually(second_done)
        latest = (await runs(stack))[-1]
        assert (latest.seq_from, latest.seq_to, latest.unchanged, latest.added) == (3, 4, 2, 0)
    finally:
        await stack.stop()
