"""The Tools gRPC API end to end on a real port: catalog, calls, model mistakes, bad requests, cancel."""

from __future__ import annotations

import asyncio
import json
import os
import uuid

import grpc
import pytest

from agentmesh.internal.v1 import tools_service_pb2
from agentmesh.v1 import tools_pb2
from tests.tools.support import ToolsClient, describe, processes_with, wait_until

EXPECTED_TOOLS = {"shell", "python", "read_file", "write_file", "edit_file", "list_dir"}


async def test_list_tools_serves_json_schemas(tools):
    reply = await tools.stub.ListTools(tools_pb2.ListToolsRequest())
    by_name = {t.name: t for t in reply.tools}
    assert set(by_name) >= EXPECTED_TOOLS
    shell = json.loads(by_name["shell"].parameters_json_schema)
    assert shell["required"] == ["command"]
    assert set(shell["properties"]) == {"command", "timeout_s"}
    assert by_name["shell"].runs_code and not by_name["read_file"].runs_code


async def test_shell_runs_in_the_workspace(tools):
    result = await tools.call("shell", {"command": "echo hello > greeting.txt; cat greeting.txt; pwd; id -u"})
    assert not result.is_error, result.output
    assert result.exit_code == 0
    assert result.stdout.split() == ["hello", "/workspace", "65534"]
    assert (tools.workspace("s1") / "greeting.txt").read_text() == "hello\n"
    assert result.duration_ms > 0


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root service drops jailed programs to another host uid")
async def test_a_root_service_runs_jailed_programs_as_an_unprivileged_host_user(tools):
    await tools.call("write_file", {"path": "by-tool/a.txt", "content": "x"})
    result = await tools.call("shell", {"command": "echo y > by-shell.txt; echo z >> by-tool/a.txt"})
    assert not result.is_error, result.output
    workspace = tools.workspace("s1")
    for path in (workspace, workspace / "by-shell.txt", workspace / "by-tool", workspace / "by-tool/a.txt"):
        assert path.stat().st_uid == 65534, path


async def test_files_written_by_tools_are_seen_by_commands_and_back(tools):
    wrote = await tools.call("write_file", {"path": "notes/a.txt", "content": "one\ntwo\n"})
    assert not wrote.is_error, wrote.output
    shown = await tools.call("shell", {"command": "wc -l < notes/a.txt; echo three >> notes/a.txt"})
    assert shown.stdout.strip() == "2"
    read = await tools.call("read_file", {"path": "notes/a.txt"})
    assert read.output == "one\ntwo\nthree\n"
    listing = await tools.call("list_dir", {"path": ".", "depth": 2})
    assert "notes/" in listing.output and "notes/a.txt" in listing.output


async def test_nonzero_exit_is_an_error_result_with_its_output(tools):
    result = await tools.call("shell", {"command": "echo out; echo err >&2; exit 3"})
    assert result.is_error and result.error_kind == "nonzero_exit"
    assert result.exit_code == 3
    assert result.stdout == "out\n" and result.stderr == "err\n"
    assert "[exit code 3]" in result.output


async def test_unknown_tool_is_a_result_the_model_can_read(tools):
    result = await tools.call("rm_rf", {})
    assert result.is_error and result.error_kind == "unknown_tool"
    assert "no tool named 'rm_rf'" in result.output and "shell" in result.output


@pytest.mark.parametrize(
    "name,arguments,fragment",
    [
        ("shell", {}, "'command' is a required property"),
        ("shell", {"command": "true", "timeout_s": "soon"}, "timeout_s"),
        ("read_file", {"path": "a", "bogus": 1}, "Additional properties"),
        ("write_file", "{not json", "not valid JSON"),
        ("list_dir", {"depth": 99}, "depth"),
    ],
)
async def test_bad_arguments_are_reported_before_anything_runs(tools, name, arguments, fragment):
    result = await tools.call(name, arguments)
    assert result.is_error and result.error_kind == "invalid_arguments"
    assert fragment in result.output
    assert not tools.workspace("s1").exists() or not any(tools.workspace("s1").iterdir())


@pytest.mark.parametrize("session_id", ["", "..", "a/b", "x" * 129, "../../etc"])
async def test_malformed_session_id_is_invalid_argument(tools, session_id):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await tools.call("shell", {"command": "true"}, session_id=session_id)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "session_id" in err.value.details()
    assert not (tools.home / "etc").exists()


async def test_oversized_arguments_are_invalid_argument(tools):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await tools.call("write_file", {"path": "big", "content": "x" * (2 * 1024 * 1024)})
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "arguments_json" in err.value.details()


async def test_timeout_kills_the_command(tools):
    result = await tools.call("shell", {"command": "echo started; sleep 30", "timeout_s": 0.5})
    assert result.is_error and result.error_kind == "timeout"
    assert result.stdout == "started\n"
    assert "time limit" in result.output


async def test_caller_timeout_bounds_the_tool_default(tools):
    result = await tools.call("shell", {"command": "sleep 30"}, timeout_s=0.5)
    assert result.error_kind == "timeout"


async def test_cancelling_execute_kills_the_process_tree(tools):
    marker = f"{uuid.uuid4().int % 10**6 + 1000}.25"
    call = tools.stub.Execute(
        tools_service_pb2.ExecuteRequest(
            session_id="s1", call_id="c1", name="shell",
            arguments_json=json.dumps({"command": f"sleep {marker} & sleep {marker}; wait"}),
        )
    )
    assert await wait_until(lambda: len(processes_with(f"sleep {marker}")) >= 2), "the command never started"
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert await wait_until(lambda: not processes_with(marker)), f"left running:\n{describe(processes_with(marker))}"


async def test_delete_workspace(tools):
    await tools.call("write_file", {"path": "a.txt", "content": "x"}, session_id="gone")
    assert tools.workspace("gone").exists()
    reply = await tools.as_gateway.DeleteWorkspace(tools_service_pb2.DeleteWorkspaceRequest(session_id="gone"))
    assert reply.deleted and not tools.workspace("gone").exists()
    again = await tools.as_gateway.DeleteWorkspace(tools_service_pb2.DeleteWorkspaceRequest(session_id="gone"))
    assert not again.deleted


@pytest.mark.parametrize("delay_s", [0.0, 0.005, 0.02, 0.05, 0.1])
async def test_cancelling_at_any_moment_of_jail_setup_leaves_nothing(tools, delay_s):
    marker = f"{uuid.uuid4().int % 10**6 + 1000}.75"
    call = tools.stub.Execute(
        tools_service_pb2.ExecuteRequest(
            session_id="s1", call_id="c1", name="shell", arguments_json=json.dumps({"command": f"sleep {marker}"})
        )
    )
    await asyncio.sleep(delay_s)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert await wait_until(lambda: not processes_with(marker)), f"left running:\n{describe(processes_with(marker))}"


async def test_delete_workspace_removes_what_a_program_locked(tools):
    made = await tools.call("shell", {"command": "mkdir -p locked/deep && touch locked/deep/f && chmod 0 locked/deep locked"}, session_id="locked")
    assert not made.is_error, made.output
    reply = await tools.as_gateway.DeleteWorkspace(tools_service_pb2.DeleteWorkspaceRequest(session_id="locked"))
    assert reply.deleted and not tools.workspace("locked").exists()


async def test_calls_beyond_the_sandbox_limit_wait_their_turn_within_their_time_limit(home):
    async with ToolsClient(home, {"AGENTMESH_SANDBOX_MAX_CONCURRENT": "1"}) as tools:
        busy = asyncio.ensure_future(tools.call("shell", {"command": "sleep 3", "timeout_s": 10}, call_id="busy"))
        await asyncio.sleep(0.3)
        waiting = await tools.call("shell", {"command": "echo late", "timeout_s": 0.5}, call_id="waiting")
        assert waiting.is_error and waiting.error_kind == "timeout"
        assert "busy" in waiting.output
        first = await busy
        assert not first.is_error, first.output
        after = await tools.call("shell", {"command": "echo now"})
        assert after.stdout == "now\n"
