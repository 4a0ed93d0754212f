"""Authentication at the gateway, and the CLI driving a running stack."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentmesh.v1 import gateway_pb2, sessions_pb2
from tests.e2e.conftest import collect, of_kind, rpc_error
from tests.support.llm_server import ScriptedLLMServer, reply, tool_call
from tests.support.stack import Stack


async def test_gateway_requires_a_bearer_token_when_configured(tmp_path):
    with ScriptedLLMServer([reply("hello")]) as llm:
        async with Stack(tmp_path, llm.base_url, env={"AGENTMESH_AUTH_TOKENS": "tok-a,tok-b"}) as stack:
            gateway = stack.gateway_stub()
            request = gateway_pb2.ChatRequest(session_id="s", message="hi")

            err = await rpc_error(collect(gateway.Chat(request, timeout=10)))
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "Bearer" in err.details()
            err = await rpc_error(
                gateway.ListSessions(sessions_pb2.ListSessionsRequest(), metadata=(("authorization", "Bearer wrong"),), timeout=10)
            )
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED
            assert llm.requests == []

            events = await collect(gateway.Chat(request, metadata=(("authorization", "Bearer tok-b"),), timeout=30))
            assert of_kind(events, "run_finished")[0].final_text == "hello"

            # Probes stay open.
            health = health_pb2_grpc.HealthStub(stack.channel("gateway"))
            status = await health.Check(health_pb2.HealthCheckRequest(service="agentmesh.v1.Gateway"), timeout=5)
            assert status.status == health_pb2.HealthCheckResponse.SERVING


async def run_cli(stack: Stack, *args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTMESH_")}
    env.update(stack.env)
    env.update({f"AGENTMESH_{name.upper()}_ADDR": addr for name, addr in stack.addresses.items()})
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentmesh.cli.main", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode(), err.decode()


async def test_cli_chat_json_prints_one_typed_event_per_line(stack, llm):
    llm.add(reply("", tool_call("shell", {"command": "echo from-the-jail"})), reply("All done."))
    code, out, err = await run_cli(stack, "chat", "go", "--session", "cli-s", "--json")
    assert code == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    types = [e["type"] for e in events]
    assert types[0] == "run_started" and events[0]["session_id"] == "cli-s"
    assert types[-1] == "run_finished"
    call = next(e for e in events if e["type"] == "tool_call")
    assert call["name"] == "shell" and call["arguments"] == {"command": "echo from-the-jail"} and call["call_id"]
    result = next(e for e in events if e["type"] == "tool_result")
    assert result["call_id"] == call["call_id"] and not result["is_error"] and "from-the-jail" in result["output"]
    assert "".join(e["text"] for e in events if e["type"] == "text_delta") == "All done."
    assert events[-1]["iterations"] == 2 and events[-1]["usage"]["total_tokens"] > 0

    code, out, _ = await run_cli(stack, "sessions", "list", "--json")
    assert code == 0 and [s["session_id"] for s in json.loads(out)] == ["cli-s"]
    code, out, _ = await run_cli(stack, "sessions", "show", "cli-s")
    assert code == 0 and "[user] go" in out and "All done." in out


async def test_cli_reports_server_errors_with_exit_code_1(stack, llm):
    code, _, err = await run_cli(stack, "chat", "", "--session", "x")
    assert code == 1
    assert "message is empty" in err and "INVALID_ARGUMENT" in err
    code, _, err = await run_cli(stack, "sessions", "show", "never-made")
    assert code == 1 and "NOT_FOUND" in err


async def test_cli_tools_run_prints_the_structured_result(stack):
    code, out, _ = await run_cli(stack, "tools", "run", "shell", '{"command": "echo hi; exit 4"}', "--session", "t1", "--json")
    result = json.loads(out)
    assert code == 1  # the tool reported an error
    assert result["exit_code"] == 4 and "hi" in result["stdout"] and result["is_error"] is True
    code, out, _ = await run_cli(stack, "tools", "list")
    assert code == 0 and "shell" in out and "read_file" in out
