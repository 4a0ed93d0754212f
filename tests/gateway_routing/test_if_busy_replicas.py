"""A second message to a busy session through the replica that does not run its turn: the
owner applies the if_busy policy, so interrupt and rollback reach the running turn."""

from __future__ import annotations

import pytest

from agentmesh.v1 import gateway_pb2
from tests.gateway_routing.replicas import Replicas
from tests.support.llm_server import reply, tool_call
from tests.support.turns import LiveTurn, collect, of_kind

A, B = 0, 1


@pytest.mark.parametrize("policy, stop_reason", [("interrupt", "interrupted"), ("rollback", "rolled_back")])
async def test_interrupt_and_rollback_through_the_other_replica(replicas: Replicas, llm, policy, stop_reason):
    session = replicas.session_owned_by(A, prefix=policy)
    # shell is held for approval in these backends: the turn waits there, mid-tool-call.
    llm.add(reply("", tool_call("shell", {"command": "echo never"}, id="c1")), reply("Redirected."))
    first = LiveTurn(replicas.stub(A), session, "first")
    await first.approval_request()

    request = gateway_pb2.ChatRequest(session_id=session, message="second",
                                      options=gateway_pb2.ChatOptions(if_busy=policy))
    events = await collect(replicas.stub(B).Chat(request, timeout=30))
    first_events = await first.finished()

    assert of_kind(first_events, "run_finished")[0].stop_reason == stop_reason
    assert of_kind(events, "run_finished")[0].final_text == "Redirected."
    roles = [m["role"] for m in llm.requests[-1].body["messages"] if m["role"] != "system"]
    assert roles == (["user", "assistant", "tool", "user"] if policy == "interrupt" else ["user"])
