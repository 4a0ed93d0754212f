"""Session routing across gateway replicas, over real gRPC: one turn per session whichever
replica a call lands on; Cancel, Approve and ListApprovals reach the turn wherever it runs."""

from __future__ import annotations

import grpc
import pytest

from agentmesh.gateway.routing import owner_of
from agentmesh.rpc.errors import error_info_of
from agentmesh.telemetry.spanstore import read_spans, span_store_dir
from agentmesh.v1 import gateway_pb2, sessions_pb2
from tests.gateway_routing.replicas import FakeDNS, Replicas
from tests.support.llm_server import reply, tool_call
from tests.support.timing import polling
from tests.support.turns import LiveTurn, collect, kinds, of_kind

A, B = 0, 1
TOKEN = "tok-routing-0123456789abcdef"


def chat_request(session_id: str, message: str = "go") -> gateway_pb2.ChatRequest:
    return gateway_pb2.ChatRequest(session_id=session_id, message=message)


async def refused(awaitable) -> grpc.aio.AioRpcError:
    """The error a unary call or a whole stream ends with."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        if hasattr(awaitable, "__aiter__"):
            await collect(awaitable)
        else:
            await awaitable
    return info.value


def held_call(call_id: str = "c1", command: str = "echo held"):
    """A turn that stops at a shell call waiting for approval (the agent holds `shell`)."""
    return reply("", tool_call("shell", {"command": command}, id=call_id))


def assert_one_intact_run(events) -> None:
    assert kinds(events)[0] == "run_started" and kinds(events)[-1] == "run_finished"
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert len({e.run_id for e in events}) == 1 and events[0].run_id


def reason_of(err: grpc.aio.AioRpcError) -> str:
    info = error_info_of(err)
    return info.reason if info is not None else ""


async def test_a_turn_through_the_other_replica_runs_once_on_the_owner(replicas, llm):
    session = replicas.session_owned_by(B)
    a, b = replicas.stub(A), replicas.stub(B)
    llm.add(held_call(command="echo routed > routed.txt"), reply("All done."))
    turn = LiveTurn(a, session, "make the file")
    request = await turn.approval_request()
    run_id = turn.events[0].run_id

    # Busy wherever the next turn lands: the owner runs it, the other replica asks the owner.
    for stub in (a, b):
        err = await refused(stub.Chat(chat_request(session), timeout=10))
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "already running a turn" in err.details()
        assert reason_of(err) == "SESSION_BUSY"  # the owner's reason, relayed with its status
        err = await refused(stub.DeleteSession(sessions_pb2.DeleteSessionRequest(session_id=session), timeout=10))
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and reason_of(err) == "SESSION_BUSY"
        listing = await stub.ListApprovals(gateway_pb2.ListApprovalsRequest(session_id=session), timeout=10)
        assert listing.run_id == run_id and [p.call_id for p in listing.approvals] == [request.call_id]
    # A decision on a call the turn does not hold is the owner's NOT_FOUND, relayed unchanged.
    err = await refused(a.Approve(gateway_pb2.ApproveRequest(session_id=session, call_id="nope"), timeout=10))
    assert err.code() == grpc.StatusCode.NOT_FOUND and "no tool call 'nope' waiting" in err.details()
    assert reason_of(err) == "APPROVAL_NOT_FOUND"

    # Seen through A, decided through B.
    answer = await b.Approve(gateway_pb2.ApproveRequest(session_id=session, call_id="c1", approved=True), timeout=10)
    assert answer.accepted and answer.run_id == run_id
    events = await turn.finished()
    assert_one_intact_run(events)
    assert of_kind(events, "approval_resolved")[0].decided_by == "user"
    assert not of_kind(events, "tool_result")[0].result.is_error
    assert of_kind(events, "run_finished")[0].final_text == "All done."
    assert (replicas.stack.settings.home / "workspaces" / session / "routed.txt").read_text() == "routed\n"

    # The session is free again through either replica, and can be deleted through the non-owner.
    llm.add(reply("again"))
    assert of_kind(await collect(b.Chat(chat_request(session), timeout=30)), "run_finished")[0].final_text == "again"
    deleted = await a.DeleteSession(sessions_pb2.DeleteSessionRequest(session_id=session), timeout=10)
    assert deleted.deleted


@pytest.mark.parametrize("owner", [A, B])
async def test_cancel_and_approvals_reach_the_turn_through_the_replica_that_does_not_run_it(replicas, llm, owner):
    session = replicas.session_owned_by(owner, prefix=f"cancel{owner}")
    other = B if owner == A else A
    llm.add(held_call(command="touch never.txt"))
    turn = LiveTurn(replicas.stub(owner), session, "go")
    await turn.approval_request()

    listing = await replicas.stub(other).ListApprovals(gateway_pb2.ListApprovalsRequest(session_id=session), timeout=10)
    assert [p.call_id for p in listing.approvals] == ["c1"]
    answer = await replicas.stub(other).Cancel(gateway_pb2.CancelRequest(session_id=session), timeout=10)
    assert answer.cancelled and answer.run_id == turn.events[0].run_id
    events = await turn.finished()
    assert kinds(events)[-1] == "run_finished" and events[-1].run_finished.stop_reason == "cancelled"
    assert not (replicas.stack.settings.home / "workspaces" / session / "never.txt").exists()
    # Nothing runs any more, as both replicas tell.
    for stub in (replicas.stub(A), replicas.stub(B)):
        answer = await stub.Cancel(gateway_pb2.CancelRequest(session_id=session), timeout=10)
        assert not answer.cancelled


async def test_bad_input_is_refused_by_the_first_replica(replicas):
    for stub in (replicas.stub(A), replicas.stub(B)):
        err = await refused(stub.Chat(gateway_pb2.ChatRequest(session_id="bad id!", message="hi"), timeout=10))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        err = await refused(stub.Cancel(gateway_pb2.CancelRequest(session_id="bad id!"), timeout=10))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_with_the_owner_gone_the_survivor_serves_the_session(replicas, llm):
    session = replicas.session_owned_by(B, prefix="orphan")
    await replicas.stop_replica(B)
    a = replicas.stub(A)
    llm.add(reply("served by the survivor"))
    events = await collect(a.Chat(chat_request(session), timeout=30))
    assert_one_intact_run(events)
    assert of_kind(events, "run_finished")[0].final_text == "served by the survivor"
    # Cancel, ListApprovals and Approve fall back the same way.
    assert not (await a.Cancel(gateway_pb2.CancelRequest(session_id=session), timeout=10)).cancelled
    assert not (await a.ListApprovals(gateway_pb2.ListApprovalsRequest(session_id=session), timeout=10)).run_id
    err = await refused(a.Approve(gateway_pb2.ApproveRequest(session_id=session, call_id="c1"), timeout=10))
    assert err.code() == grpc.StatusCode.NOT_FOUND


async def test_replicas_that_disagree_on_membership_do_not_bounce_calls(backends, llm):
    # A lists both and sends the session to B; B lists only A and would send it back. The
    # forwarded call is marked, so B serves it instead.
    async with Replicas(backends, count=2, peers={A: [A, B], B: [A]}) as replicas:
        session = replicas.session_owned_by(B, prefix="split")
        llm.add(reply("no ping-pong"))
        events = await collect(replicas.stub(A).Chat(chat_request(session), timeout=30))
        assert of_kind(events, "run_finished")[0].final_text == "no ping-pong"


async def test_forwarded_calls_carry_the_callers_credentials(backends, llm):
    async with Replicas(backends, count=2, env={"AGENTMESH_AUTH_TOKENS": TOKEN}) as replicas:
        session = replicas.session_owned_by(B, prefix="auth")
        a = replicas.stub(A)
        err = await refused(a.Chat(chat_request(session), timeout=10))
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED
        err = await refused(a.Cancel(gateway_pb2.CancelRequest(session_id=session), timeout=10))
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED
        wrong = (("authorization", "Bearer not-the-token"),)
        err = await refused(a.Chat(chat_request(session), timeout=10, metadata=wrong))
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED

        good = (("authorization", f"Bearer {TOKEN}"),)
        llm.add(held_call())
        turn = LiveTurn(a, session, "go", metadata=good)
        await turn.approval_request()
        # Running on B, reached through A with the caller's token.
        err = await refused(replicas.stub(B).Chat(chat_request(session), timeout=10, metadata=good))
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert (await a.Cancel(gateway_pb2.CancelRequest(session_id=session), timeout=10, metadata=good)).cancelled
        events = await turn.finished()
        assert_one_intact_run(events)
        assert events[-1].run_finished.stop_reason == "cancelled"


async def test_a_forwarded_turn_is_one_trace(backends, llm):
    async with Replicas(backends, count=2) as replicas:
        session = replicas.session_owned_by(B, prefix="trace")
        llm.add(reply("traced"))
        events = await collect(replicas.stub(A).Chat(chat_request(session), timeout=30))
        trace_id = of_kind(events, "run_finished")[0].trace_id
        assert trace_id
    # Both replicas stopped, so their spans are flushed; the backends' are flushed here.
    for host in backends.hosts.values():
        host.telemetry.force_flush()
    spans = [s for s in read_spans(span_store_dir(backends.settings.home)) if s["trace_id"] == trace_id]
    chats = [s for s in spans if s["name"] == "/agentmesh.v1.Gateway/Chat" and s["kind"] == "SERVER"]
    assert len(chats) == 2  # the replica the client called, and the owner it forwarded to
    index = {s["span_id"]: s for s in spans}
    root = [s for s in chats if not s["parent_span_id"]]
    assert len(root) == 1
    owner_chat = next(s for s in chats if s["parent_span_id"])
    # The owner's span hangs under the first replica's, through its client span.
    parent = index[owner_chat["parent_span_id"]]
    assert parent["kind"] == "CLIENT" and index[parent["parent_span_id"]] is root[0]
    assert any(s["name"] == "/agentmesh.internal.v1.Agent/RunTurn" and s["kind"] == "SERVER" for s in spans)


async def test_a_replica_that_drains_ends_the_turns_it_relays_with_a_reason(replicas, llm):
    session = replicas.session_owned_by(B, prefix="drain")
    llm.add(held_call(command="touch never.txt"))
    turn = LiveTurn(replicas.stub(A), session, "go")
    await turn.approval_request()

    # The drain ends the relayed stream with its reason at once; a grace of some seconds lets a
    # loaded machine write it before the server cancels what is left (1 s was outrun once).
    await replicas.stop_replica(A, grace=5)
    events = await turn.finished()
    error = of_kind(events, "error")[0]
    assert error.code == "UNAVAILABLE" and "shutting down" in error.message
    assert events[-1].seq == events[-2].seq + 1 and events[-1].run_id == events[0].run_id
    # The owner's turn stopped with the stream: the session takes its next turn at once.
    b = replicas.stub(B)
    await _until_idle(b, session)
    llm.add(reply("next"))
    assert of_kind(await collect(b.Chat(chat_request(session), timeout=30)), "run_finished")[0].final_text == "next"


async def _until_idle(stub, session: str) -> None:
    async for _ in polling(0.05):
        listing = await stub.ListApprovals(gateway_pb2.ListApprovalsRequest(session_id=session), timeout=10)
        if not listing.run_id:
            return
    raise AssertionError(f"session {session} still runs a turn")


async def test_an_owner_that_dies_mid_turn_ends_the_relayed_stream_with_an_error_event(replicas, llm):
    session = replicas.session_owned_by(B, prefix="dies")
    llm.add(held_call(command="touch never.txt"))
    turn = LiveTurn(replicas.stub(A), session, "go")
    await turn.approval_request()

    await replicas.hosts[B].server.stop(None)  # no drain: every stream it serves is cut
    events = await turn.finished()
    error = of_kind(events, "error")[0]
    assert "stopped answering" in error.message and "send the message again" in error.message
    assert events[-1].seq == events[-2].seq + 1


# --- membership changes: the previous owner keeps its running turn ------------------------------

C = 2


def session_moving(replicas: Replicas, before: list[int], after: list[int], to: int, prefix: str) -> tuple[str, int]:
    """A session whose owner changes to `to` when the peers go from `before` to `after`."""
    def owner(session: str, indexes: list[int]) -> str:
        return owner_of(session, [replicas.addresses[i] for i in indexes])

    for n in range(2000):
        session = f"{prefix}-{n}"
        if owner(session, after) == replicas.addresses[to] and owner(session, before) != replicas.addresses[to]:
            return session, replicas.addresses.index(owner(session, before))
    raise AssertionError("no such session")


async def test_a_replica_joining_does_not_start_a_second_turn_beside_a_running_one(backends, llm):
    dns = FakeDNS([])
    async with Replicas(backends, count=3, dns=dns) as replicas:
        await dns.change([replicas.addresses[A], replicas.addresses[B]], [A, B, C])  # C not Ready yet
        session, first_owner = session_moving(replicas, [A, B], [A, B, C], to=C, prefix="join")
        llm.add(held_call(command="echo handed > handed.txt"), reply("finished where it started"))
        via = A if first_owner == B else B  # through the replica that owns it neither before nor after
        turn = LiveTurn(replicas.stub(via), session, "go")
        await turn.approval_request()

        await dns.change(replicas.addresses, [A, B, C])  # C is Ready: it owns the session now
        for index in (A, B, C):
            err = await refused(replicas.stub(index).Chat(chat_request(session), timeout=10))
            assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, index
        listing = await replicas.stub(C).ListApprovals(gateway_pb2.ListApprovalsRequest(session_id=session), timeout=10)
        assert [p.call_id for p in listing.approvals] == ["c1"]
        answer = await replicas.stub(via).Approve(gateway_pb2.ApproveRequest(session_id=session, call_id="c1", approved=True), timeout=10)
        assert answer.run_id == turn.events[0].run_id
        events = await turn.finished()
        assert of_kind(events, "run_finished")[0].final_text == "finished where it started"

        # Over: the new owner takes the next turn.
        llm.add(reply("new owner"))
        events = await collect(replicas.stub(via).Chat(chat_request(session), timeout=30))
        assert of_kind(events, "run_finished")[0].final_text == "new owner"


async def test_a_replica_leaving_still_answers_for_its_last_turn(backends, llm):
    dns = FakeDNS([])
    async with Replicas(backends, count=2, dns=dns) as replicas:
        await dns.change(replicas.addresses, [A, B])
        session = replicas.session_owned_by(B, prefix="leave")
        llm.add(held_call(command="touch never.txt"))
        turn = LiveTurn(replicas.stub(A), session, "go")
        await turn.approval_request()

        # B is draining: no longer Ready, so out of the DNS answer, while it finishes its turn.
        await dns.change([replicas.addresses[A]], [A, B])
        err = await refused(replicas.stub(A).Chat(chat_request(session), timeout=10))
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
        answer = await replicas.stub(A).Cancel(gateway_pb2.CancelRequest(session_id=session), timeout=10)
        assert answer.cancelled and answer.run_id == turn.events[0].run_id
        events = await turn.finished()
        assert events[-1].run_finished.stop_reason == "cancelled"
