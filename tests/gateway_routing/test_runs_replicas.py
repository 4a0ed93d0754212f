"""Runs over real gRPC across two gateway replicas (docs/api.md, "Runs"): CreateRun answers at
once with the run while its turn runs on with no client attached; GetRun, ListRuns, JoinRun and
CancelRun reach it through either replica; its record (state, usage, stop reason) is memory's."""

from __future__ import annotations

import asyncio

import grpc

from agentmesh.v1 import gateway_pb2
from tests.gateway_routing.test_replicas import A, B, held_call, reason_of, refused
from tests.support.llm_server import reply
from tests.support.turns import collect, kinds


def create(session_id: str, message: str = "go", **options) -> gateway_pb2.CreateRunRequest:
    return gateway_pb2.CreateRunRequest(session_id=session_id, message=message,
                                        options=gateway_pb2.ChatOptions(**options))


async def state_of(stub, run_id: str) -> str:
    return (await stub.GetRun(gateway_pb2.GetRunRequest(run_id=run_id), timeout=10)).state


async def wait_for_state(stub, run_id: str, state: str) -> None:
    """Until GetRun says `state` (a generous bound, not a timing claim)."""
    async with asyncio.timeout(30):
        while await state_of(stub, run_id) != state:
            await asyncio.sleep(0.05)


async def test_a_run_created_through_one_replica_is_joined_listed_and_finished_through_the_other(replicas, llm):
    session = replicas.session_owned_by(B)
    a, b = replicas.stub(A), replicas.stub(B)
    llm.add(held_call(command="echo held"), reply("All done."))

    # Created through A (not the owner): it answers with the run, which waits on the owner, B.
    run = await a.CreateRun(create(session, "make the file"), timeout=10)
    assert run.run_id.startswith("run") and run.session_id == session and run.namespace == "default"
    assert run.state in ("queued", "running", "waiting_for_approval")

    # No client is attached: the run holds its tool call for approval, durably recorded.
    await wait_for_state(a, run.run_id, "waiting_for_approval")
    await wait_for_state(b, run.run_id, "waiting_for_approval")

    # Joined through A from its start: every event so far, then the live ones to its end.
    joined = a.JoinRun(gateway_pb2.JoinRunRequest(run_id=run.run_id), timeout=60)
    first = await joined.read()
    assert first.WhichOneof("payload") == "run_started" and first.run_id == run.run_id
    await b.Approve(gateway_pb2.ApproveRequest(session_id=session, call_id="c1", approved=True), timeout=10)
    events = [first, *await collect(joined)]
    assert kinds(events)[-1] == "run_finished" and "approval_request" in kinds(events)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))

    # Joined again through B from a seq: only what came after it.
    tail = await collect(b.JoinRun(gateway_pb2.JoinRunRequest(run_id=run.run_id, after_seq=events[-2].seq), timeout=30))
    assert [e.seq for e in tail] == [events[-1].seq]

    # Listed through either replica: succeeded, with its usage and stop reason.
    for stub in (a, b):
        listing = await stub.ListRuns(gateway_pb2.ListTurnRunsRequest(session_id=session), timeout=10)
        assert [r.run_id for r in listing.runs] == [run.run_id]
        done = listing.runs[0]
        assert done.state == "succeeded" and done.stop_reason == "completed"
        assert done.usage.total_tokens > 0 and done.finished_at >= done.started_at > 0
        assert done.last_event_seq == events[-1].seq
    listing = await a.ListRuns(gateway_pb2.ListTurnRunsRequest(states=["running"]), timeout=10)
    assert run.run_id not in [r.run_id for r in listing.runs]


async def test_cancel_run_stops_a_running_run_through_either_replica(replicas, llm):
    session = replicas.session_owned_by(B)
    a = replicas.stub(A)
    llm.add(held_call(command="echo never"))
    run = await a.CreateRun(create(session), timeout=10)
    await wait_for_state(a, run.run_id, "waiting_for_approval")

    cancelled = await a.CancelRun(gateway_pb2.CancelRunRequest(run_id=run.run_id), timeout=30)
    assert cancelled.state == "cancelled" and cancelled.stop_reason == "cancelled"
    await wait_for_state(replicas.stub(B), run.run_id, "cancelled")
    # The session is free again, and cancelling an ended run changes nothing.
    again = await a.CancelRun(gateway_pb2.CancelRunRequest(run_id=run.run_id), timeout=30)
    assert again.state == "cancelled"


async def test_bad_run_requests_are_refused_with_a_reason_and_change_nothing(replicas, llm):
    a = replicas.stub(A)
    err = await refused(a.CreateRun(create("s-bad", ""), timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "message" in err.details()
    assert reason_of(err)
    err = await refused(a.GetRun(gateway_pb2.GetRunRequest(run_id="run-nope"), timeout=10))
    assert err.code() == grpc.StatusCode.NOT_FOUND and "there is no run 'run-nope'" in err.details()
    err = await refused(a.GetRun(gateway_pb2.GetRunRequest(run_id="no such!"), timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and reason_of(err)
    err = await refused(a.ListRuns(gateway_pb2.ListTurnRunsRequest(states=["done"]), timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "state 'done' is not one of" in err.details()
    err = await refused(a.JoinRun(gateway_pb2.JoinRunRequest(run_id="run-x", after_seq=-1), timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert not (await a.ListRuns(gateway_pb2.ListTurnRunsRequest(), timeout=10)).runs

