"""Tool policies and permission modes end to end (docs/approvals.md): which tools a turn is
offered (deployment, namespace, session, turn), which calls are held (auto, normal, manual),
approving the rest of a turn, clearing a transcript — over real gRPC across the five services,
the model a scripted OpenAI-protocol server that refuses a broken tool-call history."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from agentmesh.v1 import common_pb2, gateway_pb2, sessions_pb2, tools_pb2
from tests.e2e.conftest import chat, of_kind, rpc_error, transcript
from tests.support.llm_server import ScriptedLLMServer, protocol_errors, reply, tool_call
from tests.support.stack import Stack
from tests.support.turns import LiveTurn, wait_until

# The deployment turns `python` off for everyone.
POLICY_ENV = {"AGENTMESH_GATEWAY_TOOLS_DENY": "python"}


@pytest.fixture
def llm():
    with ScriptedLLMServer(check_protocol=True) as server:
        yield server


@pytest.fixture
async def stack(tmp_path, llm):
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=POLICY_ENV) as running:
        yield running


def offered(request) -> set[str]:
    return {t["function"]["name"] for t in request.body.get("tools") or []}


def workspace(stack: Stack, session_id: str):
    return stack.settings.home / "workspaces" / session_id


async def session_in(gateway, session_id: str, namespace: str = "default", **changes) -> None:
    await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id=session_id, namespace=namespace), timeout=10)
    if changes:
        await gateway.UpdateSession(sessions_pb2.UpdateSessionRequest(session_id=session_id, **changes), timeout=10)


async def put_file(gateway, session_id: str, path: str, text: str) -> None:
    await gateway.WriteWorkspaceFile(tools_pb2.WriteWorkspaceFileRequest(
        session_id=session_id, path=path, content=text.encode()), timeout=10)


async def test_a_denied_tool_is_never_offered_and_a_call_to_it_never_runs(stack, llm):
    gateway = stack.gateway_stub()
    settings = await gateway.UpdateNamespaceSettings(sessions_pb2.UpdateNamespaceSettingsRequest(
        namespace="team", tools=common_pb2.ToolPolicy(deny=["shell"])), timeout=10)
    assert list(settings.tools.deny) == ["shell"] and settings.updated_at > 0
    await session_in(gateway, "t1", namespace="team")
    # The model calls `shell` anyway (as a model may, from an earlier conversation or a guess).
    llm.add(reply("", tool_call("shell", {"command": "touch ran.txt"}, id="c1")), reply("It is off here."))
    events = await chat(gateway, "t1", "make a file")

    first = llm.requests[0]
    assert "shell" not in offered(first) and "python" not in offered(first)  # namespace's and deployment's
    assert {"read_file", "write_file", "memory_search"} <= offered(first)
    assert of_kind(events, "approval_request") == []
    result = of_kind(events, "tool_result")[0].result
    assert result.is_error and result.error_kind == "not_allowed"
    assert "shell was not run" in result.output and "tool policy" in result.output
    assert not (workspace(stack, "t1") / "ran.txt").exists()
    assert protocol_errors(llm.requests[1].body["messages"]) == []
    assert of_kind(events, "run_finished")[0].final_text == "It is off here."

    # ListTools shows the effective catalog: everyone loses python, the namespace loses shell too.
    everywhere = {t.name for t in (await gateway.ListTools(tools_pb2.ListToolsRequest(), timeout=10)).tools}
    in_team = {t.name for t in (await gateway.ListTools(tools_pb2.ListToolsRequest(namespace="team"), timeout=10)).tools}
    of_session = {t.name for t in (await gateway.ListTools(tools_pb2.ListToolsRequest(session_id="t1"), timeout=10)).tools}
    assert "python" not in everywhere and "shell" in everywhere
    assert in_team == of_session == everywhere - {"shell"}
    catalog = {t.name: t for t in (await gateway.ListTools(tools_pb2.ListToolsRequest(), timeout=10)).tools}
    assert catalog["read_file"].read_only and catalog["grep"].read_only
    assert not catalog["write_file"].read_only and not catalog["shell"].read_only


async def test_bad_policies_and_modes_are_refused_and_change_nothing(stack, llm):
    gateway = stack.gateway_stub()
    await gateway.UpdateNamespaceSettings(sessions_pb2.UpdateNamespaceSettingsRequest(
        namespace="team", tools=common_pb2.ToolPolicy(deny=["shell"])), timeout=10)
    await session_in(gateway, "bad", namespace="team")

    err = await rpc_error(gateway.UpdateNamespaceSettings(sessions_pb2.UpdateNamespaceSettingsRequest(
        namespace="team", tools=common_pb2.ToolPolicy(deny=["shel"])), timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "no tool named 'shel'" in err.details()
    err = await rpc_error(gateway.UpdateNamespaceSettings(sessions_pb2.UpdateNamespaceSettingsRequest(
        namespace="team", tools=common_pb2.ToolPolicy(allow=["rm -rf"])), timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "not a tool name or pattern" in err.details()
    kept = await gateway.GetNamespaceSettings(sessions_pb2.GetNamespaceSettingsRequest(namespace="team"), timeout=10)
    assert list(kept.tools.deny) == ["shell"] and list(kept.tools.allow) == []

    for request in (
        sessions_pb2.UpdateSessionRequest(session_id="bad", tools=common_pb2.ToolPolicy(allow=["read_flie"])),
        sessions_pb2.UpdateSessionRequest(session_id="bad", permission_mode="sometimes"),
        sessions_pb2.UpdateSessionRequest(session_id="bad", update_mask=["title"]),
    ):
        err = await rpc_error(gateway.UpdateSession(request, timeout=10))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, request
    session = await gateway.GetSession(sessions_pb2.GetSessionRequest(session_id="bad"), timeout=10)
    assert session.permission_mode == "" and list(session.tools.allow) == []

    err = await rpc_error(chat(gateway, "bad", "hi", permission_mode="yolo"))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "auto, normal or manual" in err.details()
    err = await rpc_error(chat(gateway, "bad", "hi", tools=common_pb2.ToolPolicy(allow=["a b"])))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "options.tools" in err.details()
    assert llm.requests == [] and await transcript(gateway, "bad") == []

    # Setting only the mode leaves the model alone; {"model": ""} alone still resets the model.
    changed = await gateway.UpdateSession(sessions_pb2.UpdateSessionRequest(session_id="bad", permission_mode="manual"),
                                          timeout=10)
    assert changed.permission_mode == "manual"


async def test_a_turn_narrows_what_its_session_allows_and_cannot_widen_it(stack, llm):
    gateway = stack.gateway_stub()
    await session_in(gateway, "narrow", tools=common_pb2.ToolPolicy(allow=["read_file", "write_file", "list_dir"]))
    llm.add(reply("", tool_call("shell", {"command": "touch widened.txt"}, id="c1")), reply("Not allowed."))
    events = await chat(gateway, "narrow", "go", tools=common_pb2.ToolPolicy(allow=["write_file", "shell"], deny=["list_dir"]))

    # The turn's allow list meets the session's: only write_file is in both; shell is in neither.
    assert offered(llm.requests[0]) == {"write_file"}
    result = of_kind(events, "tool_result")[0].result
    assert result.error_kind == "not_allowed" and not (workspace(stack, "narrow") / "widened.txt").exists()

    llm.add(reply("All three."))
    await chat(gateway, "narrow", "again")
    assert offered(llm.requests[-1]) == {"read_file", "write_file", "list_dir"}  # the turn's narrowing is gone


async def test_normal_mode_holds_a_write_and_never_a_read(stack, llm):
    gateway = stack.gateway_stub()
    await session_in(gateway, "norm", permission_mode="normal")
    await put_file(gateway, "norm", "notes.txt", "hello\n")
    llm.add(reply("", tool_call("read_file", {"path": "notes.txt"}, id="r1"),
                  tool_call("write_file", {"path": "out.txt", "content": "x"}, id="w1")),
            reply("Done."))
    turn = LiveTurn(gateway, "norm", "copy it")

    held = await turn.approval_request()
    assert (held.call_id, held.name) == ("w1", "write_file")
    # The read ran while the write waits.
    await wait_until(lambda: any(r.result.call_id == "r1" for r in turn.of_kind("tool_result")))
    assert not (workspace(stack, "norm") / "out.txt").exists()
    await gateway.Approve(gateway_pb2.ApproveRequest(session_id="norm", call_id="w1", approved=True), timeout=10)
    events = await turn.finished()
    assert [a.call_id for a in of_kind(events, "approval_request")] == ["w1"]
    assert (workspace(stack, "norm") / "out.txt").read_text() == "x"


async def test_manual_mode_for_one_turn_holds_even_a_read(stack, llm):
    gateway = stack.gateway_stub()
    await session_in(gateway, "man")
    await put_file(gateway, "man", "notes.txt", "hello\n")
    llm.add(reply("", tool_call("read_file", {"path": "notes.txt"}, id="r1")), reply("Read."))
    turn = LiveTurn(gateway, "man", "read it", permission_mode="manual")
    held = await turn.approval_request()
    assert (held.call_id, held.name) == ("r1", "read_file")
    await asyncio.sleep(0.3)
    assert turn.of_kind("tool_result") == []  # nothing ran while it waits
    await gateway.Approve(gateway_pb2.ApproveRequest(session_id="man", call_id="r1", approved=True), timeout=10)
    events = await turn.finished()
    assert "hello" in of_kind(events, "tool_result")[0].result.output

    # The session's mode (auto by default) holds nothing in the next turn.
    llm.add(reply("", tool_call("read_file", {"path": "notes.txt"}, id="r2")), reply("Read again."))
    events = await chat(gateway, "man", "read it again")
    assert of_kind(events, "approval_request") == []


async def test_approving_the_rest_of_a_turn_lets_its_calls_through_and_the_next_turn_holds_again(stack, llm):
    gateway = stack.gateway_stub()
    await session_in(gateway, "rest", permission_mode="manual")
    llm.add(reply("", tool_call("write_file", {"path": "a.txt", "content": "a"}, id="c1"),
                  tool_call("write_file", {"path": "b.txt", "content": "b"}, id="c2")),
            reply("", tool_call("write_file", {"path": "c.txt", "content": "c"}, id="c3")),
            reply("Three files."))
    turn = LiveTurn(gateway, "rest", "write three files")
    await wait_until(lambda: len(turn.of_kind("approval_request")) == 2)

    err = await rpc_error(gateway.Approve(gateway_pb2.ApproveRequest(
        session_id="rest", call_id="c1", approved=False, rest_of_turn=True), timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    await gateway.Approve(gateway_pb2.ApproveRequest(session_id="rest", call_id="c1", approved=True, rest_of_turn=True),
                          timeout=10)
    events = await turn.finished()

    assert sorted(a.call_id for a in of_kind(events, "approval_request")) == ["c1", "c2"]  # c3 was never held
    resolved = {r.call_id: r for r in of_kind(events, "approval_resolved")}
    assert resolved["c1"].approved and resolved["c2"].approved and resolved["c2"].note == "approved with the rest of the turn"
    assert all(not r.result.is_error for r in of_kind(events, "tool_result"))
    assert sorted(p.name for p in workspace(stack, "rest").iterdir()) == ["a.txt", "b.txt", "c.txt"]

    llm.add(reply("", tool_call("write_file", {"path": "d.txt", "content": "d"}, id="c4")), reply("Held."))
    turn = LiveTurn(gateway, "rest", "one more")
    held = await turn.approval_request()
    assert held.call_id == "c4"
    await gateway.Approve(gateway_pb2.ApproveRequest(session_id="rest", call_id="c4", approved=False), timeout=10)
    events = await turn.finished()
    assert of_kind(events, "tool_result")[0].result.error_kind == "denied"


async def test_clearing_a_transcript_keeps_the_session_and_its_workspace(stack, llm):
    gateway = stack.gateway_stub()
    llm.add(reply("", tool_call("write_file", {"path": "kept.txt", "content": "k"}, id="c1")), reply("First."))
    await chat(gateway, "clr", "remember this")
    assert len(await transcript(gateway, "clr")) == 4

    llm.add(reply("slow", delay_s=1.0))
    busy = LiveTurn(gateway, "clr", "busy")
    await asyncio.to_thread(llm.wait_for_requests, 3, 10)
    err = await rpc_error(gateway.ClearTranscript(sessions_pb2.ClearTranscriptRequest(session_id="clr"), timeout=10))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    await busy.finished()

    cleared = await gateway.ClearTranscript(sessions_pb2.ClearTranscriptRequest(session_id="clr"), timeout=10)
    assert cleared.cleared == 6
    assert await transcript(gateway, "clr") == []
    llm.add(reply("Fresh."))
    await chat(gateway, "clr", "hello again")
    sent = [m for m in llm.requests[-1].body["messages"] if m["role"] != "system"]
    assert [(m["role"], m["content"]) for m in sent] == [("user", "hello again")]
    assert (workspace(stack, "clr") / "kept.txt").read_text() == "k"
    err = await rpc_error(gateway.ClearTranscript(sessions_pb2.ClearTranscriptRequest(session_id="nobody"), timeout=10))
    assert err.code() == grpc.StatusCode.NOT_FOUND


async def test_the_cli_sets_namespace_and_session_policies_and_modes(stack, llm):
    from tests.e2e.test_approvals import run_cli

    code, out, err = await run_cli(stack, "tools", "deny", "team", "shell", "python")
    assert code == 0, err
    assert "namespace team: denies shell, python" in out
    code, out, _ = await run_cli(stack, "tools", "allow", "team", "read_file", "write_file", "--json")
    assert code == 0 and '"allow": [' in out and '"read_file"' in out and '"shell"' in out  # deny kept
    code, _, err = await run_cli(stack, "tools", "deny", "team", "shel")
    assert code == 1 and "no tool named 'shel'" in err
    code, out, _ = await run_cli(stack, "tools", "list", "--namespace", "team")
    assert code == 0 and [line.split()[0] for line in out.splitlines() if line[:1].isalpha()] == ["read_file", "write_file"]
    assert "[read-only]" in out
    code, out, _ = await run_cli(stack, "tools", "policy", "team", "--clear")
    assert code == 0 and "allows every tool the deployment allows" in out

    await session_in(stack.gateway_stub(), "cli-s")
    code, out, _ = await run_cli(stack, "sessions", "set-mode", "cli-s", "normal")
    assert code == 0 and "permission mode normal" in out
    code, out, _ = await run_cli(stack, "sessions", "set-tools", "cli-s", "--allow", "read_file", "--deny", "shell")
    assert code == 0 and "allows read_file; denies shell" in out
    session = await stack.gateway_stub().GetSession(sessions_pb2.GetSessionRequest(session_id="cli-s"), timeout=10)
    assert session.permission_mode == "normal" and list(session.tools.allow) == ["read_file"]
    code, _, err = await run_cli(stack, "sessions", "set-mode", "cli-s", "yolo")
    assert code == 2 and "invalid choice" in err
