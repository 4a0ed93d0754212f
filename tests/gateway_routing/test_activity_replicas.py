"""The operator's view and attaching work whichever replica a client reaches: WatchActivity on
one replica shows the turns the other runs, and AttachTurn is routed to the turn's replica."""

from __future__ import annotations

import asyncio

from agentmesh.v1 import gateway_pb2
from tests.e2e.test_activity import Watch
from tests.gateway_routing.replicas import Replicas
from tests.support.llm_server import reply, tool_call
from tests.support.turns import LiveTurn, collect, wait_until

A, B = 0, 1


async def test_watch_and_attach_through_the_replica_that_does_not_run_the_turn(replicas: Replicas, llm):
    watch = Watch(replicas.stub(B))
    await watch.live(replicas=2)  # both replicas are watched
    assert sorted(a.gateway for a in watch.items) == sorted(replicas.addresses)

    session = replicas.session_owned_by(A, prefix="watched")
    llm.add(reply("", tool_call("shell", {"command": "echo on-a"}, id="c1")), reply("Done on A."))
    first = LiveTurn(replicas.stub(A), session, "go")
    await first.approval_request()

    attached = asyncio.create_task(collect(replicas.stub(B).AttachTurn(
        gateway_pb2.AttachTurnRequest(session_id=session), timeout=30)))
    await asyncio.sleep(0.2)
    await replicas.stub(B).Approve(gateway_pb2.ApproveRequest(session_id=session, call_id="c1", approved=True), timeout=10)
    own = await first.finished()
    assert await attached == own

    await wait_until(lambda: (session, "run_finished") in watch.kinds())
    watch.stop()
    assert watch.kinds() == [(session, k) for k in ("run_started", "tool_call", "approval_request", "tool_result",
                                                     "run_finished")]
    assert {a.gateway for a in watch.items if a.WhichOneof("payload")} == {replicas.addresses[A]}
