"""How the service behaves without bubblewrap, in the loudly named unsandboxed mode, and with tracing."""

from __future__ import annotations

import json
import re

from agentmesh.internal.v1 import tools_service_pb2
from tests.tools.support import ToolsClient

SECRET = "sk-test-secret-key-0123456789"


async def test_without_bwrap_command_tools_refuse_and_say_how_to_fix_it(home):
    async with ToolsClient(home, {"AGENTMESH_SANDBOX_BWRAP": "/nonexistent/bwrap"}) as tools:
        result = await tools.call("shell", {"command": "echo should-not-run > ran.txt"})
        assert result.is_error and result.error_kind == "sandbox_unavailable"
        assert "apt-get install bubblewrap" in result.output
        assert "AGENTMESH_SANDBOX_UNSAFE_NO_ISOLATION" in result.output
        assert not (tools.workspace("s1") / "ran.txt").exists()
        # File tools run in the service itself and keep working.
        wrote = await tools.call("write_file", {"path": "a.txt", "content": "fine"})
        assert not wrote.is_error


async def test_unsafe_mode_runs_unjailed_but_with_a_clean_environment(home):
    env = {"AGENTMESH_SANDBOX_BWRAP": "/nonexistent/bwrap", "AGENTMESH_SANDBOX_UNSAFE_NO_ISOLATION": "true"}
    async with ToolsClient(home, env) as tools:
        result = await tools.call("shell", {"command": "pwd; env"})
        assert not result.is_error, result.output
        lines = result.stdout.splitlines()
        assert lines[0] == str(tools.workspace("s1"))
        assert SECRET not in result.stdout and "AGENTMESH_" not in result.stdout
        timed = await tools.call("shell", {"command": "sleep 30", "timeout_s": 0.3})
        assert timed.error_kind == "timeout"


async def test_sandboxed_programs_join_the_callers_trace(home):
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    async with ToolsClient(home, {"AGENTMESH_TRACES": "local"}) as tools:
        request = tools_service_pb2.ExecuteRequest(
            session_id="s1", call_id="c1", name="shell", arguments_json=json.dumps({"command": "echo $TRACEPARENT"})
        )
        reply = await tools.stub.Execute(request, metadata=(("traceparent", f"00-{trace_id}-00f067aa0ba902b7-01"),))
    traceparent = reply.result.stdout.strip()
    assert re.fullmatch(rf"00-{trace_id}-[0-9a-f]{{16}}-01", traceparent), traceparent
    assert traceparent.split("-")[2] != "00f067aa0ba902b7"  # the jail's own span, a child of the call


async def test_unsafe_mode_cuts_files_at_what_the_workspace_quota_leaves(home):
    env = {
        "AGENTMESH_SANDBOX_BWRAP": "/nonexistent/bwrap",
        "AGENTMESH_SANDBOX_UNSAFE_NO_ISOLATION": "true",
        "AGENTMESH_TOOLS_WORKSPACE_QUOTA_MB": "8",
    }
    async with ToolsClient(home, env) as tools:
        result = await tools.call("shell", {"command": "head -c 20M /dev/zero > big"})
        assert result.error_kind == "disk_quota", result.output
        assert "8.0 MiB disk quota" in result.output
        assert (tools.workspace("s1") / "big").stat().st_size <= 8 * 1024 * 1024
