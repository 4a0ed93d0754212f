"""Time travel: Gateway.ForkSession makes a new session from a message of another, with a copy
of its workspace, and the fork goes on differently — over real gRPC and HTTP across the five
services, with a scripted model; refusals leave nothing behind."""

from __future__ import annotations

from pathlib import Path

import grpc
import httpx
import pytest

from agentmesh.v1 import gateway_pb2, sessions_pb2
from tests.e2e.conftest import chat, of_kind, rpc_error, transcript
from tests.e2e.test_auth_and_cli import run_cli
from tests.e2e.test_tenants import _policy, auth
from tests.gateway.test_error_reasons import error_info
from tests.support.llm_server import reply, tool_call
from tests.support.stack import Stack


def workspace(stack: Stack, session_id: str) -> Path:
    return stack.settings.home / "workspaces" / session_id


async def two_turns(gateway, llm, session_id: str, metadata=None) -> list:
    """A turn that writes notes.txt (a tool call and its result) and answers, then a second turn."""
    llm.add(reply("", tool_call("write_file", {"path": "notes.txt", "content": "first draft"}, id="w1")),
            reply("Wrote the first draft."), reply("Here is the second answer."))
    for message in ("write the draft", "and then?"):
        request = gateway_pb2.ChatRequest(session_id=session_id, message=message)
        events = [e async for e in gateway.Chat(request, timeout=60, metadata=metadata)]
        assert of_kind(events, "run_finished"), events
    reply_ = await gateway.GetTranscript(sessions_pb2.GetTranscriptRequest(session_id=session_id), timeout=10,
                                         metadata=metadata)
    return list(reply_.messages)


@pytest.fixture
async def stack(tmp_path, llm):
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url) as running:
        yield running


async def test_a_fork_holds_the_transcript_up_to_the_message_and_a_copy_of_the_workspace(stack, llm):
    gateway = stack.gateway_stub()
    source = await two_turns(gateway, llm, "orig")
    (workspace(stack, "orig") / "deep" / "er").mkdir(parents=True)
    (workspace(stack, "orig") / "deep" / "er" / "data.bin").write_bytes(b"\x00\x01" * 5000)
    (workspace(stack, "orig") / "link").symlink_to("/etc/passwd")
    first_answer = next(m for m in source if m.role == "assistant" and m.content == "Wrote the first draft.")

    forked = await gateway.ForkSession(sessions_pb2.ForkSessionRequest(session_id="orig", at_seq=first_answer.seq),
                                       timeout=60)

    fork_id = forked.session.session_id
    assert fork_id != "orig" and forked.messages == first_answer.seq
    assert forked.session.labels["agentmesh.fork.of"] == "orig"
    assert forked.session.labels["agentmesh.fork.at"] == str(first_answer.seq)
    kept = await transcript(gateway, fork_id)
    assert [(m.seq, m.role, m.content) for m in kept] == [(m.seq, m.role, m.content) for m in source[:first_answer.seq]]
    # The workspace as it was when forked: files, nested directories, and a link copied as a link.
    assert (workspace(stack, fork_id) / "notes.txt").read_text() == "first draft"
    assert (workspace(stack, fork_id) / "deep" / "er" / "data.bin").read_bytes() == b"\x00\x01" * 5000
    assert (workspace(stack, fork_id) / "link").is_symlink()
    assert forked.workspace_bytes == len("first draft") + 10000 and forked.workspace_files == 5

    # The fork goes on differently; the source is as it was.
    llm.add(reply("A different second answer."))
    events = await chat(gateway, fork_id, "something else, please")
    assert of_kind(events, "run_finished")[0].final_text == "A different second answer."
    assert [m.content for m in await transcript(gateway, fork_id)][-2:] == ["something else, please",
                                                                           "A different second answer."]
    assert [m.content for m in await transcript(gateway, "orig")] == [m.content for m in source]
    (workspace(stack, fork_id) / "notes.txt").write_text("changed in the fork")
    assert (workspace(stack, "orig") / "notes.txt").read_text() == "first draft"

    # Forked at the model's tool call, the fork keeps the call's result too: no call is left unanswered.
    call = next(m for m in source if m.tool_calls)
    at_call = await gateway.ForkSession(sessions_pb2.ForkSessionRequest(
        session_id="orig", at_seq=call.seq, new_session_id="at-call", title="from the call"), timeout=60)
    assert at_call.session.session_id == "at-call" and at_call.session.title == "from the call"
    assert [m.role for m in await transcript(gateway, "at-call")][-2:] == ["assistant", "tool"]

    # Over HTTP, at the route the proto names.
    async with httpx.AsyncClient(base_url=stack.http_url) as http:
        answer = await http.post("/v1/sessions/orig:fork", json={"at_seq": 1, "new_session_id": "over-http"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["session"]["session_id"] == "over-http" and int(answer.json()["messages"]) == 1


async def test_a_seq_the_transcript_lacks_is_refused_and_nothing_is_made(stack, llm):
    gateway = stack.gateway_stub()
    source = await two_turns(gateway, llm, "orig")
    # From the command line: the seqs `sessions show` prints, and the fork at one of them.
    code, out, err = await run_cli(stack, "sessions", "show", "orig")
    assert code == 0, err
    assert "#4 [assistant] Wrote the first draft." in out
    code, out, err = await run_cli(stack, "sessions", "fork", "orig", "--at", "4", "--new-id", "from-cli")
    assert code == 0, err
    assert "forked session orig at message 4 into from-cli (4 messages, 1 workspace files)" in out
    code, out, err = await run_cli(stack, "sessions", "fork", "orig", "--at", "99")
    assert code == 1 and "at_seq 99 is not a message of session 'orig'" in err
    before = await gateway.ListSessions(sessions_pb2.ListSessionsRequest(), timeout=10)

    for seq in (0, -1, len(source) + 1):
        err = await rpc_error(gateway.ForkSession(sessions_pb2.ForkSessionRequest(
            session_id="orig", at_seq=seq, new_session_id="never"), timeout=30))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        info = error_info(err)
        assert info.reason == "SEQ_OUT_OF_RANGE" and info.metadata["message_count"] == str(len(source))
        assert f"holds messages 1 to {len(source)}" in err.details()
    err = await rpc_error(gateway.ForkSession(sessions_pb2.ForkSessionRequest(session_id="nobody", at_seq=1),
                                              timeout=30))
    assert err.code() == grpc.StatusCode.NOT_FOUND

    after = await gateway.ListSessions(sessions_pb2.ListSessionsRequest(), timeout=10)
    assert [s.session_id for s in after.sessions] == [s.session_id for s in before.sessions]
    assert not workspace(stack, "never").exists()


@pytest.fixture
async def tenants(tmp_path: Path, llm):
    policy = tmp_path / "policy.json"
    policy.write_text(_policy())
    env = {"AGENTMESH_AUTH_POLICY": str(policy), "AGENTMESH_TOOLS_WORKSPACE_QUOTA_FILES": "4"}
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=env) as running:
        yield running


async def test_only_the_sessions_tenant_forks_it_and_a_workspace_over_quota_leaves_no_fork(tenants, llm):
    stack = tenants
    gateway = stack.gateway_stub()
    member = auth("a-member")
    source = await two_turns(gateway, llm, "acme-work", member)

    # Another tenant's session does not exist for them, fork or not.
    err = await rpc_error(gateway.ForkSession(sessions_pb2.ForkSessionRequest(session_id="acme-work", at_seq=1),
                                              timeout=30, metadata=auth("b-member")))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    # A viewer of the tenant reads it, but may not make sessions from it.
    err = await rpc_error(gateway.ForkSession(sessions_pb2.ForkSessionRequest(session_id="acme-work", at_seq=1),
                                              timeout=30, metadata=auth("a-viewer")))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED

    forked = await gateway.ForkSession(sessions_pb2.ForkSessionRequest(session_id="acme-work", at_seq=len(source),
                                                                       new_session_id="acme-fork"),
                                       timeout=60, metadata=member)
    assert forked.session.namespace == "acme" and forked.messages == len(source)
    err = await rpc_error(gateway.GetSession(sessions_pb2.GetSessionRequest(session_id="acme-fork"), timeout=10,
                                             metadata=auth("b-admin")))
    assert err.code() == grpc.StatusCode.NOT_FOUND

    # More files than a workspace may hold: refused, and the fork written before the copy is gone.
    for i in range(5):
        (workspace(stack, "acme-work") / f"extra-{i}.txt").write_text("x")
    err = await rpc_error(gateway.ForkSession(sessions_pb2.ForkSessionRequest(
        session_id="acme-work", at_seq=1, new_session_id="too-big"), timeout=60, metadata=member))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and error_info(err).reason == "QUOTA_EXCEEDED"
    assert "delete files in it before forking" in err.details()
    err = await rpc_error(gateway.GetSession(sessions_pb2.GetSessionRequest(session_id="too-big"), timeout=10,
                                             metadata=member))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert not workspace(stack, "too-big").exists()
