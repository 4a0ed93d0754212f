"""The unmodified `mcp-server-time` (PyPI, stdio) through the whole stack: listed as
time__get_current_time, called by the scripted model, run inside the local jail."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from agentmesh.config import ConfigError
from agentmesh.internal.v1 import tools_service_pb2
from agentmesh.v1 import gateway_pb2, tools_pb2
from tests.mcpservers.conftest import server_pids, time_server_entry, write_servers
from tests.support.llm_server import reply, tool_call
from tests.support.stack import Stack
from tests.support.timing import polling
from tests.support.turns import collect, of_kind, wait_until

pytestmark = pytest.mark.slow


def time_env(home, **extra) -> dict:
    env = {"AGENTMESH_MCP_SERVERS": write_servers(home / "mcp.json", {"time": time_server_entry()})}
    env.update(extra)
    return env


async def test_the_model_calls_the_time_server_and_reads_its_answer(home, llm):
    llm.add(reply("", tool_call("time__get_current_time", {"timezone": "Europe/Paris"})), reply("It is late."))
    async with Stack(home / "home", llm_base_url=llm.base_url, env=time_env(home)) as stack:
        request = gateway_pb2.ChatRequest(session_id="clock", message="What time is it in Paris?")
        events = await collect(stack.gateway_stub().Chat(request, timeout=60))

    results = [e.result for e in of_kind(events, "tool_result")]
    assert len(results) == 1 and not results[0].is_error, results
    answer = json.loads(results[0].output)
    assert answer["timezone"] == "Europe/Paris" and "datetime" in answer
    assert of_kind(events, "run_finished")[0].final_text == "It is late."
    # The model was offered the tool with the server's own schema, and read the result.
    offered = {t["function"]["name"]: t["function"] for t in llm.requests[0].body["tools"]}
    assert "timezone" in offered["time__get_current_time"]["parameters"]["properties"]
    tool_messages = [m for m in llm.requests[1].body["messages"] if m["role"] == "tool"]
    assert "Europe/Paris" in tool_messages[0]["content"]


async def execute(stack, name: str, arguments: dict, timeout_s: float = 0.0):
    request = tools_service_pb2.ExecuteRequest(session_id="s1", call_id="c1", name=name,
                                       arguments_json=json.dumps(arguments), timeout_s=timeout_s)
    return (await stack.tools_stub().Execute(request, timeout=60)).result


async def test_the_server_runs_inside_the_jail(home):
    entry = time_server_entry()
    entry["env"]["TIME_TOKEN"] = "tok-${AGENTMESH_MCP_SECRET_TIME}"
    env = {"AGENTMESH_MCP_SERVERS": write_servers(home / "mcp.json", {"time": entry}),
           "AGENTMESH_MCP_SECRET_TIME": "s3cret"}
    async with Stack(home / "home", env=env, services=("memory", "tools")) as stack:
        assert not (await execute(stack, "time__get_current_time", {"timezone": "UTC"})).is_error
        [pid] = server_pids("mcp_server_time")
        # Its own user, PID and network namespaces (no network: the entry did not ask for it).
        for namespace in ("user", "pid", "net", "mnt"):
            assert os.readlink(f"/proc/{pid}/ns/{namespace}") != os.readlink(f"/proc/self/ns/{namespace}"), namespace
        # Inside, it sees only the jail's environment: none of the service's variables.
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert not any(var.startswith(b"AGENTMESH_") for var in environ)
        assert b"TIME_TOKEN=tok-s3cret" in environ  # its secret reference, resolved
        assert b"PYTHONPATH=" + time_server_entry()["env"]["PYTHONPATH"].encode() in environ
        # A process of its own (not the service's), with a PID of its own inside the jail,
        # running as the jail's user 65534.
        status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        assert pid != os.getpid() and len(status["NSpid"].split()) == 2
        assert status["Uid"].split()[0] != "0"


async def test_arguments_are_checked_against_the_servers_schema_before_the_call(home):
    async with Stack(home / "home", env=time_env(home), services=("memory", "tools")) as stack:
        result = await execute(stack, "time__get_current_time", {"timezone": 5})
        assert result.is_error and result.error_kind == "invalid_arguments"
        assert "timezone" in result.output
        # The server's own errors come back as tool errors the model can read.
        result = await execute(stack, "time__get_current_time", {"timezone": "Mars/Olympus"})
        assert result.is_error and result.error_kind == "tool_error" and "Mars/Olympus" in result.output


async def test_a_server_that_dies_is_restarted_and_an_idle_one_stopped(home):
    env = time_env(home, AGENTMESH_MCP_PING_INTERVAL_S="0.2", AGENTMESH_MCP_IDLE_S="3")
    async with Stack(home / "home", env=env, services=("memory", "tools")) as stack:
        assert not (await execute(stack, "time__get_current_time", {"timezone": "UTC"})).is_error
        [first] = server_pids("mcp_server_time")
        os.kill(first, signal.SIGKILL)
        await wait_until(lambda: server_pids("mcp_server_time") not in ([], [first]))
        # A call that meets the dead connection says so; the restarted server answers the next.
        async for _ in polling(0.25):
            result = await execute(stack, "time__get_current_time", {"timezone": "UTC"})
            if not result.is_error:
                break
            assert result.error_kind == "unavailable", result.output
        assert not result.is_error, result.output
        # Idle for longer than AGENTMESH_MCP_IDLE_S: the process ends, the tools stay listed,
        # and the next call starts it again.
        await wait_until(lambda: server_pids("mcp_server_time") == [])
        listed = await stack.tools_stub().ListTools(tools_pb2.ListToolsRequest())
        assert "time__get_current_time" in [t.name for t in listed.tools]
        assert not (await execute(stack, "time__get_current_time", {"timezone": "UTC"})).is_error
        assert len(server_pids("mcp_server_time")) == 1


@pytest.mark.parametrize("entry, message", [
    ({"command": "no-such-mcp-server"}, "command 'no-such-mcp-server' was not found"),
    ({"command": "/bin/true", "url": "http://x/mcp"}, "exactly one of 'command'"),
    ({"command": "/bin/true", "cmd": "x"}, "unknown key(s) cmd"),
    ({"url": "ftp://example.com/mcp"}, "is not an http(s) URL"),
    ({"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer ${AGENTMESH_MCP_SECRET_UNSET}"}},
     "refers to ${AGENTMESH_MCP_SECRET_UNSET}, which is not set"),
    ({"command": "/bin/true", "env": {"KEY": "${AGENTMESH_LLM_API_KEY}"}}, "must name a variable starting with AGENTMESH_MCP_SECRET_"),
    ({"command": "/bin/true", "mounts": ["/no/such/dir"]}, "mount '/no/such/dir' is not an existing absolute path"),
])
async def test_bad_configuration_stops_the_service_at_start_with_a_clear_error(home, entry, message):
    env = {"AGENTMESH_MCP_SERVERS": write_servers(home / "mcp.json", {"bad": entry})}
    assert message in str(await start_error(home, env))


async def start_error(home, env) -> Exception:
    stack = Stack(home / "home", env=env, services=("memory", "tools"))
    try:
        with pytest.raises(ConfigError) as info:
            await stack.start()
    finally:
        await stack.stop()  # what did start (memory)
    return info.value


async def test_a_server_name_that_cannot_prefix_tool_names_is_refused(home):
    env = {"AGENTMESH_MCP_SERVERS": write_servers(home / "mcp.json", {"my time": {"command": "/bin/true"}})}
    assert "letters, digits or '-'" in str(await start_error(home, env))
