"""Issue 27 through the real tools service and the real jail: in-memory file systems bounded,
trees of any depth deleted, and malformed arguments refused with a sentence (never INTERNAL)."""

from __future__ import annotations

import grpc
import pytest

from agentmesh.internal.v1 import tools_service_pb2
from agentmesh.v1 import tools_pb2
from tests.tools.support import ToolsClient

MIB = 1024 * 1024
BOUNDS = {"AGENTMESH_SANDBOX_SHM_BYTES": str(8 * MIB), "AGENTMESH_SANDBOX_TMP_BYTES": str(8 * MIB)}


@pytest.fixture
async def bounded(home):
    async with ToolsClient(home, BOUNDS) as client:
        yield client


@pytest.mark.parametrize("where", ["/tmp", "/dev/shm"])
async def test_writing_past_an_in_memory_file_systems_bound_fails_with_enospc(bounded, where):
    # 12 MiB into a tmpfs bounded at 8: the write fails in the jail (ENOSPC), the host keeps its memory.
    result = await bounded.call("python", {"code": (
        "import errno\n"
        "try:\n"
        f"    with open('{where}/fill', 'wb') as f:\n"
        "        for _ in range(12):\n"
        "            f.write(b'x' * 2**20)\n"
        "            f.flush()\n"
        "    print('wrote it all')\n"
        "except OSError as e:\n"
        "    print('refused', errno.errorcode[e.errno])\n"
    )})
    assert "refused ENOSPC" in result.output, result.output


async def test_dev_itself_takes_no_files(bounded):
    # /dev was an unbounded tmpfs of its own: 30 files of 60 MiB held 1.8 GiB of the host's memory.
    result = await bounded.call("shell", {"command": "echo x > /dev/hog && echo written; ls /dev/null /dev/zero /dev/urandom"})
    assert "written" not in result.output
    assert "Read-only file system" in result.output and "/dev/urandom" in result.output, result.output


async def test_what_the_tmpfs_hold_counts_against_the_jails_memory(home):
    env = {"AGENTMESH_SANDBOX_MEMORY_BYTES": str(64 * MIB), "AGENTMESH_SANDBOX_TMP_BYTES": str(200 * MIB)}
    async with ToolsClient(home, env) as tools:
        # No process holds this memory: only the file in /tmp does.
        result = await tools.call("shell", {"command": "head -c 100M /dev/zero > /tmp/big; sleep 30", "timeout_s": 60})
    assert result.error_kind == "oom", result.output


async def test_a_workspace_3000_directories_deep_is_deleted(tools):
    made = await tools.call("python", {"code": (
        "import os\n"
        "for _ in range(3000):\n"
        "    os.mkdir('d'); os.chdir('d')\n"
        "open('f', 'w').write('x'); os.mkdir('locked'); os.chmod('locked', 0)\n"
    )}, session_id="deep")
    assert not made.is_error, made.output
    reply = await tools.as_gateway.DeleteWorkspace(tools_service_pb2.DeleteWorkspaceRequest(session_id="deep"), timeout=120)
    assert reply.deleted and not tools.workspace("deep").exists()


async def test_an_upload_2000_directories_deep_is_deleted_with_its_workspace(tools):
    path = "x/" * 2000 + "f.txt"
    written = await tools.as_gateway.WriteWorkspaceFile(
        tools_pb2.WriteWorkspaceFileRequest(session_id="upload", path=path, content=b"deep"), timeout=60)
    assert written.created
    reply = await tools.as_gateway.DeleteWorkspace(tools_service_pb2.DeleteWorkspaceRequest(session_id="upload"), timeout=120)
    assert reply.deleted and not tools.workspace("upload").exists()


def deep(levels: int) -> str:
    return '{"command": "echo hi", "x": ' + "[" * levels + "]" * levels + "}"


@pytest.mark.parametrize("arguments, said", [
    (deep(100_000), "nest too deeply"),
    (deep(64), "nest too deeply"),  # 65 levels with the arguments' own object
    ('{"command": "ls", "timeout_s": NaN}', "NaN is not a JSON number"),
    ('{"command": "ls", "timeout_s": Infinity}', "Infinity is not a JSON number"),
    ('{"command": "echo a\\u0000b"}', "NUL character"),
])
async def test_malformed_shell_arguments_are_an_invalid_arguments_result(tools, arguments, said):
    result = await tools.call("shell", arguments)
    assert result.is_error and result.error_kind == "invalid_arguments", result.output
    assert said in result.output


@pytest.mark.parametrize("tool, arguments", [
    ("read_file", '{"path": "a\\ud800b"}'),
    ("write_file", '{"path": "\\udfff", "content": "x"}'),
    ("shell", '{"command": "echo \\ud83d"}'),
])
async def test_a_lone_surrogate_is_an_invalid_arguments_result(tools, tool, arguments):
    result = await tools.call(tool, arguments)
    assert result.is_error and result.error_kind == "invalid_arguments", result.output
    assert "lone UTF-16 surrogate" in result.output


async def test_a_background_command_with_a_nul_is_refused(tools):
    result = await tools.call("background_run", {"command": "sleep 1\x00; rm -rf /workspace"})
    assert result.is_error and result.error_kind == "invalid_arguments" and "NUL" in result.output


async def test_a_nan_caller_timeout_is_invalid_argument(tools):
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await tools.call("shell", {"command": "ls"}, timeout_s=float("nan"))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "timeout_s must be a non-negative number" in raised.value.details()


async def test_depth_within_the_bound_reaches_the_schema_check(tools):
    result = await tools.call("shell", deep(63))
    assert result.error_kind == "invalid_arguments" and "nest too deeply" not in result.output
    assert "Additional properties are not allowed ('x' was unexpected)" in result.output


@pytest.mark.slow  # a whole stack (conftest.py: the quick tier leaves stacks out)
async def test_model_written_arguments_30000_deep_are_one_error_result_and_the_turn_goes_on(home, llm):
    from agentmesh.v1 import gateway_pb2
    from tests.support.llm_server import reply, tool_call
    from tests.support.stack import Stack
    from tests.support.turns import collect, of_kind

    deep_call = tool_call("shell", deep(30_000), id="deep")
    llm.add(reply("", deep_call, tool_call("shell", {"command": "echo still-here"}, id="fine")), reply("Recovered."))
    async with Stack(home, llm_base_url=llm.base_url) as stack:
        request = gateway_pb2.ChatRequest(session_id="deep-args", message="go")
        events = await collect(stack.gateway_stub().Chat(request, timeout=120))

    results = {e.result.call_id: e.result for e in of_kind(events, "tool_result")}
    assert results["deep"].is_error and results["deep"].error_kind == "invalid_arguments", results["deep"]
    assert "nest too deeply" in results["deep"].output
    assert not results["fine"].is_error and "still-here" in results["fine"].output
    assert of_kind(events, "run_finished")[0].final_text == "Recovered."


@pytest.mark.slow  # a whole stack (conftest.py: the quick tier leaves stacks out)
async def test_a_session_whose_workspace_is_3000_directories_deep_is_deleted_through_the_gateway(home, llm):
    from agentmesh.v1 import gateway_pb2, sessions_pb2
    from tests.support.llm_server import reply, tool_call
    from tests.support.stack import Stack
    from tests.support.turns import collect, of_kind

    nest = "import os\nfor _ in range(3000):\n    os.mkdir('x'); os.chdir('x')\nprint('nested')\n"
    llm.add(reply("", tool_call("python", {"code": nest}, id="nest")), reply("Nested."))
    async with Stack(home, llm_base_url=llm.base_url) as stack:
        gateway = stack.gateway_stub()
        events = await collect(gateway.Chat(gateway_pb2.ChatRequest(session_id="deep-tree", message="nest"), timeout=120))
        assert "nested" in of_kind(events, "tool_result")[0].result.output
        workspace = home / "workspaces" / "deep-tree"
        assert workspace.is_dir()
        deleted = await gateway.DeleteSession(sessions_pb2.DeleteSessionRequest(session_id="deep-tree"), timeout=120)
        assert deleted.deleted and not workspace.exists()
        with pytest.raises(grpc.aio.AioRpcError) as gone:
            await gateway.GetSession(sessions_pb2.GetSessionRequest(session_id="deep-tree"), timeout=30)
        assert gone.value.code() == grpc.StatusCode.NOT_FOUND


async def test_no_host_path_is_on_the_command_line_a_jailed_program_sees(tools):
    result = await tools.call("shell", {"command": "tr '\\0' ' ' < /proc/1/cmdline"})
    assert result.stdout.startswith("/usr/bin/bwrap --args "), result.output
    assert str(tools.home) not in result.stdout


def test_a_jail_being_built_is_not_charged_the_hosts_tmp():
    # Until bwrap has pivoted into the jail, its init's root is the host's, whose /tmp may hold
    # gigabytes: counted as the jail's, short calls of a loaded machine were stopped as `oom`.
    # A process whose root is the host's (this one) has no jail tmpfs to count.
    import os

    from agentmesh.tools.sandbox.jail_watch import tmpfs_usage

    assert tmpfs_usage(os.getpid(), {"/tmp": 8 * MIB, "/dev/shm": 8 * MIB}) == 0
