"""Deep work and sub-agents end to end: all five services over real gRPC, a scripted model server.

One deep turn plans, delegates writing a file to a sub-agent (which runs the sandboxed
write_file in the parent's workspace), reads the file back itself and answers; the child's
transcript is a session of its own, and its spans hang under the parent's delegate_task span.
"""

from __future__ import annotations

import json

import grpc

from agentmesh.telemetry.spanstore import read_spans, span_store_dir
from agentmesh.v1 import gateway_pb2, sessions_pb2
from tests.e2e.conftest import chat, collect, of_kind, rpc_error, transcript
from tests.support.llm_server import ScriptedLLMServer, reply, tool_call
from tests.support.stack import Stack

SUB = "You are a sub-agent"


def tool_results(request) -> list[str]:
    return [m["content"] for m in request.messages if m["role"] == "tool"]


def model(request):
    last = request.messages[-1]
    if last["role"] == "system" and "numbered plan" in last["content"]:
        return reply("1. have a sub-agent write report.txt\n2. read it back\n3. answer")
    if SUB in request.messages[0]["content"]:
        if not tool_results(request):
            return reply("", tool_call("write_file", {"path": "report.txt", "content": "written by the sub-agent\n"}))
        return reply("I wrote report.txt.")
    results = tool_results(request)
    if not results:
        return reply("Delegating the writing.",
                     tool_call("delegate_task", {"task": "Write report.txt containing 'written by the sub-agent'."},
                               id="call_delegate"))
    if len(results) == 1:
        return reply("", tool_call("read_file", {"path": "report.txt"}, id="call_read"))
    return reply(f"The sub-agent said: {results[0]} The file says: {results[1].strip()}")


async def test_an_unknown_mode_is_refused_before_anything_happens(stack, llm):
    gateway = stack.gateway_stub()
    request = gateway_pb2.ChatRequest(session_id="modes", message="hi", options=gateway_pb2.ChatOptions(mode="turbo"))
    err = await rpc_error(collect(gateway.Chat(request, timeout=10)))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == "options.mode 'turbo' is not a run mode: use \"default\" (or leave it empty) or \"deep\""
    listing = await gateway.ListSessions(sessions_pb2.ListSessionsRequest(), timeout=10)
    assert list(listing.sessions) == [] and llm.requests == []


async def test_a_deep_turn_delegates_through_all_five_services(tmp_path):
    home = tmp_path / "home"
    with ScriptedLLMServer(default=model) as llm:
        # The free-text plan (no task board), so the scripted model need not keep a board.
        stack = Stack(home, llm_base_url=llm.base_url, env={"AGENTMESH_AGENT_TASK_MODES": "none"})
        await stack.start()
        try:
            gateway = stack.gateway_stub()
            events = await chat(gateway, "deep-e2e", "Produce the report, deeply.", mode="deep")
            finished = of_kind(events, "run_finished")
            assert finished, of_kind(events, "error")
            finished = finished[0]
            child = next(r.result for r in of_kind(events, "tool_result") if r.result.name == "delegate_task")
            child_id = child.data["session_id"]
            child_transcript = await transcript(gateway, child_id)
            parent_transcript = await transcript(gateway, "deep-e2e")
            sessions = (await gateway.ListSessions(sessions_pb2.ListSessionsRequest(), timeout=10)).sessions
            workspace_file = home / "workspaces" / "deep-e2e" / "report.txt"
            written = workspace_file.read_text() if workspace_file.exists() else None
            # Deleting the conversation deletes the sub-agent's session with it.
            await gateway.DeleteSession(sessions_pb2.DeleteSessionRequest(session_id="deep-e2e"), timeout=10)
            child_after_delete = await rpc_error(gateway.GetSession(sessions_pb2.GetSessionRequest(session_id=child_id)))
        finally:
            await stack.stop()
        model_calls = len(llm.requests)

    assert finished.stop_reason == "completed"
    assert child_after_delete.code() == grpc.StatusCode.NOT_FOUND
    assert finished.final_text == ("The sub-agent said: I wrote report.txt. "
                                   "The file says: written by the sub-agent")
    assert finished.iterations == 4  # plan + three steps; the child's calls are not the parent's steps
    assert finished.usage.input_tokens == 10 * model_calls  # every call, the child's included (10 each)
    assert not child.is_error and child.output == "I wrote report.txt."
    # The sub-agent wrote into the parent's workspace: the parent read it back with its own tool.
    assert written == "written by the sub-agent\n"

    statuses = [s.message for s in of_kind(events, "status")]
    assert statuses[0].startswith("deep work: planning") and "step 1 of 50" in statuses
    label = "sub-agent 1 (Write report.txt containing 'written by…)"  # the task, shortened
    assert f"{label}: calling write_file" in statuses
    assert f"{label}: started in session {child_id}" in statuses

    assert child_id.startswith("deep-e2e.sub-")
    assert [m.role for m in child_transcript] == ["user", "assistant", "tool", "assistant"]
    assert child_transcript[2].name == "write_file" and child_transcript[-1].content == "I wrote report.txt."
    assert parent_transcript[1].content.startswith("Plan:\n1. have a sub-agent write report.txt")
    listed = {s.session_id: s for s in sessions}
    assert dict(listed[child_id].labels) == {"parent_session": "deep-e2e", "role": "sub-agent"}

    # One trace: the child's invoke_agent under the parent's execute_tool delegate_task, and the
    # child's write_file reaching the tools service inside it.
    spans = [s for s in read_spans(span_store_dir(home)) if s["trace_id"] == finished.trace_id]
    by_id = {s["span_id"]: s for s in spans}
    invokes = [s for s in spans if s["name"] == "invoke_agent"]
    child_invoke = next(s for s in invokes if s["attributes"]["gen_ai.conversation.id"] == child_id)
    holder = by_id[child_invoke["parent_span_id"]]
    assert holder["name"] == "execute_tool delegate_task"
    assert holder["attributes"]["gen_ai.tool.call.id"] == "call_delegate"
    assert child_invoke["attributes"]["gen_ai.agent.name"] == "agentmesh/sub-agent"
    write = next(s for s in spans if s["name"] == "execute_tool write_file")
    assert write["parent_span_id"] == child_invoke["span_id"]
    # The call's CLIENT span (carried on the agent's stream to tools), the tools service's beneath it.
    call = next(s for s in spans if s["kind"] == "CLIENT" and s["name"] == "/agentmesh.internal.v1.Tools/Execute"
                and s["parent_span_id"] == write["span_id"])
    assert any(s["service"] == "agentmesh-tools" and s["parent_span_id"] == call["span_id"] for s in spans)


async def test_cli_chat_mode_deep(stack, llm):
    from tests.e2e.test_auth_and_cli import run_cli

    # The plan's one item becomes task #1 on the board; the model marks it done, then answers.
    llm.add(reply("1. answer"), reply("", tool_call("task_update", {"id": 1, "status": "done"})),
            reply("deep via the CLI"))
    code, out, err = await run_cli(stack, "chat", "think hard", "--session", "cli-deep", "--mode", "deep", "--json")
    assert code == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert events[-1]["type"] == "run_finished" and events[-1]["iterations"] == 3
    boards = [e["tasks"] for e in events if e["type"] == "task_update"]
    assert [[(t["id"], t["status"]) for t in b] for b in boards] == [[(1, "pending")], [(1, "done")]]
    code, out, err = await run_cli(stack, "tasks", "cli-deep")
    assert code == 0, err
    assert out.splitlines() == ["[x] #1 answer — done", "1 task: 1 done"]
    assert "step 1 of 50" in [e.get("message") for e in events if e["type"] == "status"]
    assert "numbered plan" in llm.requests[0].messages[-1]["content"]
    code, out, _ = await run_cli(stack, "sessions", "show", "cli-deep")
    assert code == 0 and "Plan:" in out and "deep via the CLI" in out

    code, _, err = await run_cli(stack, "chat", "hi", "--mode", "turbo")
    assert code == 2 and "invalid choice: 'turbo'" in err
