"""A held call approved with arguments a person edited: checked against the tool's schema while
the call still waits, run with the edit in the sandbox, and the edit on record — over real gRPC
across the five services, with a scripted model."""

from __future__ import annotations

import json

import grpc
import pytest

from agentmesh.v1 import gateway_pb2
from tests.e2e.conftest import of_kind, rpc_error, transcript
from tests.e2e.test_approvals import APPROVAL_ENV, approve, workspace
from tests.gateway.test_error_reasons import error_info
from tests.support.llm_server import reply, tool_call
from tests.support.stack import Stack
from tests.support.turns import LiveTurn


@pytest.fixture
async def stack(tmp_path, llm):
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=APPROVAL_ENV) as running:
        yield running


async def test_an_approval_with_edited_arguments_runs_the_edit_and_records_it(stack, llm):
    gateway = stack.gateway_stub()
    llm.add(reply("", tool_call("shell", {"command": "echo from-the-model > out.txt"}, id="c1")), reply("Done."))
    turn = LiveTurn(gateway, "edit", "write the file")
    await turn.approval_request()

    edited = json.dumps({"command": "echo edited-by-a-person > out.txt && cat out.txt"})
    await gateway.Approve(gateway_pb2.ApproveRequest(session_id="edit", call_id="c1", approved=True,
                                                     arguments_json=edited), timeout=10)
    events = await turn.finished()

    resolved = of_kind(events, "approval_resolved")[0]
    assert resolved.approved and json.loads(resolved.arguments_json) == json.loads(edited)
    result = of_kind(events, "tool_result")[0].result
    # The sandbox ran the person's command, not the model's.
    assert not result.is_error and result.exit_code == 0
    assert "edited-by-a-person" in result.output
    assert (workspace(stack, "edit") / "out.txt").read_text() == "edited-by-a-person\n"
    # On record: the call's result says it ran with edited arguments, and which; the model read it.
    stored = [m for m in await transcript(gateway, "edit") if m.role == "tool"]
    assert stored[0].content.startswith("[the user edited the arguments before approving; shell ran with ")
    assert "edited-by-a-person" in stored[0].content
    assert "edited-by-a-person" in json.dumps(llm.requests[-1].messages)


async def test_edited_arguments_the_schema_refuses_leave_the_call_waiting(stack, llm):
    gateway = stack.gateway_stub()
    llm.add(reply("", tool_call("shell", {"command": "echo model > out.txt"}, id="c1")), reply("Done."))
    turn = LiveTurn(gateway, "bad-edit", "write the file")
    await turn.approval_request()

    for arguments, says in ((json.dumps({"command": 5}), "invalid arguments for shell"),
                            ("[1, 2]", "must be a JSON object"),
                            ("{not json", "not valid JSON")):
        err = await rpc_error(gateway.Approve(gateway_pb2.ApproveRequest(
            session_id="bad-edit", call_id="c1", approved=True, arguments_json=arguments), timeout=10))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
        assert says in err.details() and "still waiting" in err.details()
        assert error_info(err).metadata["field"] == "arguments_json"
    err = await rpc_error(gateway.Approve(gateway_pb2.ApproveRequest(
        session_id="bad-edit", call_id="c1", approved=False, arguments_json="{}"), timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "a denied call does not run" in err.details()

    # Nothing changed: the call still waits, and runs as the model asked once approved.
    listing = await gateway.ListApprovals(gateway_pb2.ListApprovalsRequest(session_id="bad-edit"), timeout=10)
    assert [a.call_id for a in listing.approvals] == ["c1"]
    await gateway.Approve(approve("bad-edit", "c1"), timeout=10)
    events = await turn.finished()
    assert of_kind(events, "approval_resolved")[0].arguments_json == ""
    assert (workspace(stack, "bad-edit") / "out.txt").read_text() == "model\n"
