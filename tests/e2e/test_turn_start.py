"""What a turn reads before its first model call, and that none of it goes stale:

- the gateway makes no call to memory before a turn: the agent's one call to memory (StartTurn)
  creates the session when missing and brings it with its namespace's settings, the
  transcript, recall, standing instructions, skills and promoted tools; and, once per catalog
  version, one ListTools; the model calls' usage records travel with the appends; no
  BackgroundResults call in a session without background commands;
- the catalog the agent keeps follows every change: a namespace's MCP server added or removed,
  a server's `list_changed`; and settings changed through the API apply to the next turn.

Over real gRPC across the five services; the model is the scripted OpenAI-protocol server.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mcp.server.mcpserver import Context, MCPServer

from agentmesh.v1 import common_pb2, gateway_pb2, learning_pb2, sessions_pb2, tools_pb2
from tests.e2e.conftest import chat, of_kind
from tests.mcpservers.conftest import write_servers
from tests.mcpservers.http_server import HttpMcpServer
from tests.support.llm_server import ScriptedLLMServer, reply, tool_call
from tests.support.stack import Stack
from tests.support.timing import polling

# The calls a turn made before it: one each, none of them any more.
FOLDED = {"PutSession", "GetSession", "GetNamespaceSettings", "GetProfile", "ListSkills", "ListPromotedTools"}


@pytest.fixture
def llm():
    with ScriptedLLMServer(check_protocol=True) as server:
        yield server


def offered(request) -> set[str]:
    return {t["function"]["name"] for t in request.body.get("tools") or []}


def server_calls(home: Path) -> dict[str, list[str]]:
    """Per trace, the RPCs the memory and tools services served (from the local span store)."""
    calls: dict[str, list[str]] = {}
    for path in (home / "traces").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            span = json.loads(line)
            if span["kind"] == "SERVER" and span["service"] in ("agentmesh-memory", "agentmesh-tools"):
                calls.setdefault(span["trace_id"], []).append(span["name"].rsplit("/", 1)[-1])
    return calls


async def test_a_turn_reads_what_it_needs_in_one_call_to_memory_and_lists_the_catalog_once(tmp_path, llm):
    home = tmp_path / "home"
    trace_ids = []
    # The usage records wait for their appends however loaded the machine (the default 20 ms is
    # outrun by a loaded one, and the record then goes alone, as it should).
    async with Stack(home, llm_base_url=llm.base_url, env={"AGENTMESH_AGENT_USAGE_HOLD_S": "30"}) as stack:
        gateway = stack.gateway_stub()
        for n in range(3):
            llm.add(reply("", tool_call("shell", {"command": "true"}, id=f"c{n}"), usage=(10, 1)), reply("done", usage=(20, 2)))
            events = await chat(gateway, "s1", f"turn {n}")
            trace_ids.append(of_kind(events, "run_finished")[0].trace_id)
        # Every model call's usage is in the ledger when the turn ends, though none was sent alone.
        ledger = await gateway.GetUsage(gateway_pb2.GetUsageRequest(range="all"), timeout=10)
        assert (ledger.total.calls, ledger.total.input_tokens, ledger.total.output_tokens) == (6, 90, 9)
    calls = server_calls(home)  # the stack is stopped: every span exported
    for n, trace_id in enumerate(trace_ids):
        served = calls[trace_id]
        assert not FOLDED & set(served), served
        assert served.count("StartTurn") == 1, served
        # The first turn lists the catalog; the next ones keep it (nothing changed).
        assert served.count("ListTools") == (1 if n == 0 else 0), (n, served)
        assert served.count("Execute") == 1 and served.count("AppendMessages") == 3, served
        # No background command in the session: the tools service said so (WatchBackground), so
        # no turn asks for their results (the first may, if it starts before the watch is open).
        assert served.count("BackgroundResults") == 0 or n == 0, (n, served)
        # Each model call's usage record rides on the append of the step it produced.
        assert "RecordUsage" not in served, served


async def test_settings_changed_through_the_api_apply_to_the_next_turn(tmp_path, llm):
    catalog = tmp_path / "models.yaml"
    catalog.write_text(f"models:\n  - name: second\n    base_url: {llm.base_url}\n    model: second-model\n")
    env = {"AGENTMESH_MODELS": str(catalog), "AGENTMESH_AGENT_APPROVAL_TIMEOUT_S": "0.5",
           "AGENTMESH_GATEWAY_TOOLS_DENY": "web_fetch"}
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=env) as stack:
        gateway = stack.gateway_stub()
        await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id="s1", namespace="team"), timeout=10)
        llm.add(reply("", tool_call("list_dir", {"path": "."}, id="c1")), reply("first"))
        events = await chat(gateway, "s1", "hello")
        first = llm.requests[-1]
        assert "shell" in offered(first) and "Always answer in French" not in first.body["messages"][0]["content"]
        assert "web_fetch" not in offered(first)  # the deployment's layer
        assert first.body["model"] != "second-model" and not of_kind(events, "approval_request")
        # The session was created in the namespace it was created in, not the caller's default.
        assert of_kind(events, "run_started")[0].namespace == "team"

        # The namespace's tool policy and standing instructions, and the session's own policy,
        # model and permission mode.
        await gateway.UpdateNamespaceSettings(sessions_pb2.UpdateNamespaceSettingsRequest(
            namespace="team", tools=common_pb2.ToolPolicy(deny=["shell"])), timeout=10)
        await gateway.SetProfile(learning_pb2.SetProfileRequest(namespace="team", part="soul",
                                                                text="Always answer in French."), timeout=10)
        await gateway.UpdateSession(sessions_pb2.UpdateSessionRequest(
            session_id="s1", tools=common_pb2.ToolPolicy(deny=["python"]), model="second",
            permission_mode="manual", update_mask=["tools", "model", "permission_mode"]), timeout=10)
        llm.add(reply("", tool_call("list_dir", {"path": "."}, id="c2")), reply("second"))
        events = await chat(gateway, "s1", "hello again")
        second = llm.requests[-1]
        assert "shell" not in offered(second) and "python" not in offered(second) and "web_fetch" not in offered(second)
        assert "read_file" in offered(second)
        assert "Always answer in French." in second.body["messages"][0]["content"]
        assert second.body["model"] == "second-model"
        # Manual: even a read is held (and, undecided, times out).
        assert [a.call_id for a in of_kind(events, "approval_request")] == ["c2"]
        assert not of_kind(events, "run_started")[0].session_created

        # A turn's own choices still win over the session's.
        llm.add(reply("", tool_call("list_dir", {"path": "."}, id="c3")), reply("third"))
        events = await chat(gateway, "s1", "once more", model="default", permission_mode="auto")
        assert llm.requests[-1].body["model"] != "second-model" and not of_kind(events, "approval_request")


async def test_a_namespace_mcp_server_added_or_removed_is_in_the_next_turns_catalog(tmp_path, llm):
    with HttpMcpServer() as calc:
        env = {"AGENTMESH_TOOLS_WEB_ALLOW": f"127.0.0.1:{calc.port}"}
        async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=env) as stack:
            gateway = stack.gateway_stub()
            await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id="a1", namespace="team-a"), timeout=10)
            llm.add(reply("no calculator yet"))
            await chat(gateway, "a1", "add")
            assert "calc__add" not in offered(llm.requests[-1])

            await gateway.AddMcpServer(tools_pb2.AddMcpServerRequest(
                namespace="team-a", server=tools_pb2.McpServerSpec(name="calc", url=calc.url)), timeout=90)
            llm.add(reply("", tool_call("calc__add", {"a": 2, "b": 3}, id="c1")), reply("5."))
            events = await chat(gateway, "a1", "add")
            assert "calc__add" in offered(llm.requests[-2])
            assert not of_kind(events, "tool_result")[0].result.is_error

            await gateway.RemoveMcpServer(tools_pb2.RemoveMcpServerRequest(namespace="team-a", name="calc"), timeout=30)
            llm.add(reply("gone"))
            await chat(gateway, "a1", "add")
            assert "calc__add" not in offered(llm.requests[-1])


def growing_server() -> MCPServer:
    server = MCPServer("grower")

    def late(word: str) -> str:
        return f"late: {word}"

    @server.tool(description="Adds the tool `late`, then tells the client its tool list changed.")
    async def grow(ctx: Context) -> str:
        server.add_tool(late, description="A tool that was not there at first.")
        await ctx.session.send_tool_list_changed()
        return "grown"

    return server


async def test_a_tool_an_mcp_server_adds_while_running_is_in_a_later_turns_catalog(tmp_path, llm):
    with HttpMcpServer(growing_server()) as grower:
        env = {"AGENTMESH_MCP_SERVERS": write_servers(tmp_path / "mcp.json", {"grower": {"url": grower.url}}),
               "AGENTMESH_TOOLS_WEB_ALLOW": f"127.0.0.1:{grower.port}"}
        async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=env) as stack:
            gateway = stack.gateway_stub()
            llm.add(reply("", tool_call("grower__grow", {}, id="c1")), reply("grown"))
            await chat(gateway, "s1", "grow")
            assert "grower__late" not in offered(llm.requests[0])

            async def listed() -> set[str]:
                found = await gateway.ListTools(tools_pb2.ListToolsRequest(), timeout=10)
                return {t.name for t in found.tools}

            async for _ in polling(0.1):  # the notification is handled by the connection's watch loop
                if "grower__late" in await listed():
                    break
            llm.add(reply("", tool_call("grower__late", {"word": "hi"}, id="c2")), reply("ok"))
            events = await chat(gateway, "s1", "use the new tool")
            assert "grower__late" in offered(llm.requests[-2])
            assert "late: hi" in of_kind(events, "tool_result")[0].result.output
