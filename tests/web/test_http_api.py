"""The HTTP/JSON API: every route over real HTTP, with the same answers as gRPC."""

from __future__ import annotations

import asyncio
import base64

import grpc
import pytest

from agentmesh.internal.v1 import memory_service_pb2
from agentmesh.v1 import gateway_pb2, sessions_pb2
from tests.support.llm_server import reply, tool_call
from tests.support.timing import polling
from tests.support.turns import collect, kinds
from tests.web.conftest import stream


async def test_sessions_can_be_created_read_listed_and_deleted(http):
    created = await http.post("/v1/sessions", json={"session_id": "s1", "title": "First", "labels": {"team": "a"}})
    assert created.status_code == 200
    assert created.json()["session_id"] == "s1" and created.json()["labels"] == {"team": "a"}

    got = await http.get("/v1/sessions/s1")
    assert got.status_code == 200 and got.json()["title"] == "First"

    listed = await http.get("/v1/sessions", params={"page_size": 10})
    assert [s["session_id"] for s in listed.json()["sessions"]] == ["s1"]

    deleted = await http.delete("/v1/sessions/s1")
    assert deleted.status_code == 200 and deleted.json() == {"deleted": True}
    gone = await http.get("/v1/sessions/s1")
    assert gone.status_code == 404
    assert gone.json()["error"] == {"code": "NOT_FOUND", "message": "session 's1' does not exist", "http_status": 404,
                                    "reason": "NOT_FOUND", "domain": "agentmesh.dev", "metadata": {}}


async def test_a_tool_using_turn_streams_the_same_events_as_grpc(stack, http, llm):
    script = [reply("Writing.", tool_call("write_file", {"path": "n.txt", "content": "hi"}, id="c1")), reply("Done: n.txt.")]
    llm.add(*script)
    streamed = await stream(http, "web", {"message": "write a note"})
    assert streamed.status == 200

    assert streamed.kinds[0] == "run_started" and streamed.kinds[-1] == "run_finished"
    assert streamed.kinds.index("tool_call") < streamed.kinds.index("tool_result")
    call = streamed.data("tool_call")[0]
    assert (call["call_id"], call["name"]) == ("c1", "write_file")
    result = streamed.data("tool_result")[0]["result"]
    assert result["is_error"] is False and "n.txt" in result["output"]
    assert streamed.text == "Writing.Done: n.txt."
    finished = streamed.data("run_finished")[0]
    assert finished["stop_reason"] == "completed" and finished["final_text"] == "Done: n.txt."

    # Ids: B.N while the turn runs (B = the transcript position it began at), then the position after it.
    transcript = (await http.get("/v1/sessions/web/transcript")).json()["messages"]
    assert streamed.ids[:-1] == [f"0.{n}" for n in range(1, len(streamed.ids))]
    assert streamed.ids[-1] == str(len(transcript)) == transcript[-1]["seq"]

    # The same turn over gRPC: the same kinds of event in the same order.
    llm.add(*script)
    events = await collect(stack.gateway_stub().Chat(gateway_pb2.ChatRequest(session_id="grpc", message="write a note"), timeout=60))
    assert kinds(events) == streamed.kinds


async def test_a_sub_agent_streams_its_start_and_end_as_events_of_its_own(http, llm):
    llm.add(reply("", tool_call("delegate_task", {"task": "count the files"}, id="d1")),
            reply("3 files"), reply("There are 3."))
    streamed = await stream(http, "web-sub", {"message": "count them"})
    assert streamed.status == 200
    started, finished = streamed.data("subagent")
    assert (started["state"], finished["state"]) == ("started", "finished")
    assert started["call_id"] == finished["call_id"] == "d1" and started["task"] == "count the files"
    assert started["session_id"] == finished["session_id"] and started["session_id"].startswith("web-sub.sub-")
    assert (finished["agent"], finished["stop_reason"], finished["iterations"]) == ("", "completed", 1)
    assert int(finished["usage"]["total_tokens"]) > 0
    assert streamed.kinds.index("tool_call") < streamed.kinds.index("subagent")
    assert streamed.kinds.index("tool_result") > len(streamed.kinds) - 1 - streamed.kinds[::-1].index("subagent")


async def test_a_dropped_stream_resumes_where_it_stopped_and_the_turn_goes_on(http, llm):
    llm.add(
        reply("", tool_call("write_file", {"path": "a.txt", "content": "a"}, id="c1")),
        reply("the final answer, slowly", chunk_chars=3, pause_after_chunks=2, pause_s=1.0),
    )
    first = await stream(http, "drop", {"message": "go"}, until=lambda m: m.event == "tool_result")
    assert first.kinds[-1] == "tool_result"  # the connection is closed here, mid-turn

    resumed = await stream(http, "drop", {"message": "go"}, last_event_id=first.ids[-1])
    assert resumed.status == 200
    # Nothing twice, nothing missed: the ids go on from the last one seen.
    base, seen = first.ids[-1].split(".")
    assert resumed.ids[:-1] == [f"{base}.{n}" for n in range(int(seen) + 1, int(seen) + len(resumed.ids))]
    assert "run_started" not in resumed.kinds and "tool_result" not in resumed.kinds
    assert resumed.text == "the final answer, slowly"
    assert resumed.data("run_finished")[0]["stop_reason"] == "completed"  # the drop did not stop the turn


async def test_a_stream_resumes_from_the_transcript(http, llm):
    llm.add(reply("", tool_call("write_file", {"path": "a.txt", "content": "a"}, id="c1")), reply("All done."))
    turn = await stream(http, "replay", {"message": "make a.txt"})

    replayed = await stream(http, "replay", {"message": "make a.txt"}, last_event_id="0")
    assert set(replayed.kinds) == {"message"}
    messages = replayed.data("message")
    assert replayed.ids == [m["seq"] for m in messages] == [str(n) for n in range(1, len(messages) + 1)]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[0]["content"] == "make a.txt" and messages[-1]["content"] == "All done."

    # From the position the turn's last event carried: nothing more to send.
    caught_up = await stream(http, "replay", {"message": "make a.txt"}, last_event_id=turn.ids[-1])
    assert caught_up.status == 200 and caught_up.messages == []


async def test_a_malformed_last_event_id_is_refused(http):
    await http.post("/v1/sessions", json={"session_id": "x"})
    answer = await http.post("/v1/sessions/x/chat", json={}, headers={"Last-Event-ID": "yesterday"})
    assert answer.status_code == 400
    assert "Last-Event-ID" in answer.json()["error"]["message"]


async def test_chat_refusals_answer_with_json_before_any_event(http):
    empty = await http.post("/v1/sessions/s/chat", json={"message": "  "})
    assert empty.status_code == 400 and empty.headers["content-type"].startswith("application/json")
    assert empty.json()["error"]["message"] == "message is empty: send the text of the user's turn"
    bad_id = await http.post("/v1/sessions/bad%20id/chat", json={"message": "hi"})
    assert bad_id.status_code == 400


async def test_a_running_turn_can_be_cancelled(http, llm):
    llm.add(reply("slow", delay_s=3))
    background = asyncio.create_task(stream(http, "c", {"message": "wait"}))
    await _until(lambda: llm.requests)
    answer = await http.post("/v1/sessions/c/cancel", json={})
    assert answer.status_code == 200 and answer.json()["cancelled"] is True
    streamed = await asyncio.wait_for(background, 10)
    assert streamed.data("run_finished")[0]["stop_reason"] == "cancelled"
    idle = await http.post("/v1/sessions/c/cancel", json={})
    assert idle.json() == {"cancelled": False, "run_id": ""}


async def test_a_held_call_is_listed_and_approved(tmp_path, llm):
    import httpx

    from tests.support.stack import Stack

    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env={"AGENTMESH_AGENT_APPROVAL_TOOLS": "shell"}) as stack:
        async with httpx.AsyncClient(base_url=stack.http_url, timeout=30) as http:
            llm.add(reply("", tool_call("shell", {"command": "echo ok > ok.txt"}, id="held")), reply("Ran it."))
            background = asyncio.create_task(stream(http, "ap", {"message": "run it"}))
            pending: list = []

            async def held() -> bool:
                pending[:] = (await http.get("/v1/sessions/ap/approvals")).json()["approvals"]
                return bool(pending)

            await _until_async(held)
            assert pending[0]["call_id"] == "held" and pending[0]["name"] == "shell"
            unknown = await http.post("/v1/sessions/ap/approvals/nope", json={"approved": True})
            assert unknown.status_code == 404
            decided = await http.post("/v1/sessions/ap/approvals/held", json={"approved": True})
            assert decided.status_code == 200 and decided.json()["accepted"] is True
            streamed = await asyncio.wait_for(background, 20)
    assert streamed.kinds.index("approval_request") < streamed.kinds.index("approval_resolved") < streamed.kinds.index("tool_result")
    assert streamed.data("tool_result")[0]["result"]["exit_code"] == 0
    assert (stack.settings.home / "workspaces" / "ap" / "ok.txt").read_text() == "ok\n"


async def test_tools_are_listed(http):
    answer = await http.get("/v1/tools")
    names = {tool["name"] for tool in answer.json()["tools"]}
    assert {"shell", "read_file", "write_file"} <= names


async def test_memory_is_searched(stack, http):
    await stack.memory_stub().Remember(memory_service_pb2.RememberRequest(namespace="team", text="The deploy window is Tuesday.", kind="fact"), timeout=10)
    answer = await http.post("/v1/memory/search", json={"namespace": "team", "query": "deploy window", "k": 3})
    assert answer.status_code == 200
    assert answer.json()["hits"][0]["text"] == "The deploy window is Tuesday."
    too_many = await http.post("/v1/memory/search", json={"query": "x", "k": 1000})
    assert too_many.status_code == 400 and "k must be between 0 and 100" in too_many.json()["error"]["message"]


async def test_the_workspace_is_browsed_read_and_uploaded_to(http):
    await http.post("/v1/sessions", json={"session_id": "w"})
    content = base64.b64encode(b"a,b\n1,2\n").decode()
    uploaded = await http.put("/v1/sessions/w/workspace/file", json={"path": "data/in.csv", "content": content})
    assert uploaded.status_code == 200 and uploaded.json() == {"path": "data/in.csv", "size": "8", "created": True}

    top = await http.get("/v1/sessions/w/workspace")
    assert [(e["name"], e["type"]) for e in top.json()["entries"]] == [("data", "dir")]
    inside = await http.get("/v1/sessions/w/workspace", params={"path": "data"})
    assert [(e["path"], e["size"]) for e in inside.json()["entries"]] == [("data/in.csv", "8")]
    read = await http.get("/v1/sessions/w/workspace/file", params={"path": "data/in.csv"})
    assert base64.b64decode(read.json()["content"]) == b"a,b\n1,2\n" and read.json()["truncated"] is False

    again = await http.put("/v1/sessions/w/workspace/file", json={"path": "data/in.csv", "content": content})
    assert again.status_code == 409 and "overwrite" in again.json()["error"]["message"]
    replaced = await http.put("/v1/sessions/w/workspace/file", json={"path": "data/in.csv", "content": "", "overwrite": True})
    assert replaced.status_code == 200 and replaced.json()["created"] is False

    escape = await http.put("/v1/sessions/w/workspace/file", json={"path": "../../etc/x", "content": content})
    assert escape.status_code == 400 and "outside the workspace" in escape.json()["error"]["message"]
    missing = await http.get("/v1/sessions/w/workspace/file", params={"path": "nope.txt"})
    assert missing.status_code == 404
    stranger = await http.get("/v1/sessions/nobody/workspace")
    assert stranger.status_code == 404


async def test_an_upload_past_the_limit_is_refused(tmp_path, llm):
    import httpx

    from tests.support.stack import Stack

    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env={"AGENTMESH_TOOLS_MAX_UPLOAD_BYTES": "2048"}) as stack:
        async with httpx.AsyncClient(base_url=stack.http_url, timeout=30) as http:
            await http.post("/v1/sessions", json={"session_id": "w"})
            big = base64.b64encode(b"x" * 4096).decode()
            answer = await http.put("/v1/sessions/w/workspace/file", json={"path": "big.bin", "content": big})
    assert answer.status_code == 400
    assert answer.json()["error"]["message"] == "the file is 4096 bytes; uploads are limited to 2048 bytes"
    assert not (stack.settings.home / "workspaces" / "w" / "big.bin").exists()


async def test_a_turn_trace_is_read_from_the_span_store(stack, http, llm):
    llm.add(reply("", tool_call("write_file", {"path": "t.txt", "content": "t"})), reply("ok"))
    streamed = await stream(http, "tr", {"message": "trace me"})
    trace_id = streamed.data("run_started")[0]["trace_id"]
    for host in stack.hosts.values():
        host.telemetry.force_flush()
    answer = await http.get(f"/v1/traces/{trace_id}")
    assert answer.status_code == 200
    spans = answer.json()["spans"]
    names = [s["name"] for s in spans]
    # One trace from the HTTP request down: the HTTP span is the root, the turn is inside it.
    assert spans[0]["name"] == "POST /v1/sessions/{session_id}/chat" and spans[0]["depth"] == 0
    assert any(n.startswith("invoke_agent") for n in names) and any(n.startswith("execute_tool") for n in names)
    assert {s["service"] for s in spans} >= {"agentmesh-gateway", "agentmesh-agent", "agentmesh-tools"}

    assert (await http.get("/v1/traces/zz")).status_code == 400
    unknown = await http.get("/v1/traces/" + "0" * 32)
    assert unknown.status_code == 404


async def test_traces_kept_elsewhere_are_not_looked_for_locally(tmp_path, llm):
    import httpx

    from tests.support.stack import Stack

    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env={"AGENTMESH_TRACES": "none"}) as stack:
        async with httpx.AsyncClient(base_url=stack.http_url, timeout=30) as http:
            answer = await http.get("/v1/traces/" + "a" * 32)
    assert answer.status_code == 409 and answer.json()["error"]["code"] == "FAILED_PRECONDITION"
    assert "tracing backend" in answer.json()["error"]["message"]


async def test_malformed_requests_get_a_clear_400(stack, http):
    not_json = await http.post("/v1/sessions", content=b"{title: x}", headers={"Content-Type": "application/json"})
    assert not_json.status_code == 400 and "not valid JSON" in not_json.json()["error"]["message"]
    not_object = await http.post("/v1/sessions", json=["a"])
    assert not_object.status_code == 400 and "must be a JSON object" in not_object.json()["error"]["message"]
    unknown = await http.post("/v1/sessions", json={"titel": "x"})
    assert unknown.status_code == 400 and "unknown field 'titel'" in unknown.json()["error"]["message"]
    wrong_type = await http.post("/v1/sessions", json={"title": {"a": 1}})
    assert wrong_type.status_code == 400 and "title" in wrong_type.json()["error"]["message"]
    bad_query = await http.get("/v1/sessions", params={"page_size": "ten"})
    assert bad_query.status_code == 400 and "whole number" in bad_query.json()["error"]["message"]
    unknown_query = await http.get("/v1/sessions", params={"limit": "1"})
    assert unknown_query.status_code == 400 and "unknown query parameter 'limit'" in unknown_query.json()["error"]["message"]
    conflict = await http.post("/v1/sessions/a/cancel", json={"session_id": "b"})
    assert conflict.status_code == 400

    # The core's own refusal: the same code and sentence as over gRPC.
    over = await http.get("/v1/sessions", params={"page_size": 9999})
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stack.gateway_stub().ListSessions(sessions_pb2.ListSessionsRequest(page_size=9999), timeout=10)
    assert over.status_code == 400
    assert over.json()["error"]["code"] == info.value.code().name == "INVALID_ARGUMENT"
    assert over.json()["error"]["message"] == info.value.details()


async def test_unknown_routes_and_methods_answer_in_json(http):
    missing = await http.get("/v1/nothing")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "NOT_FOUND"
    wrong_method = await http.patch("/v1/sessions")
    assert wrong_method.status_code == 405 and "GET" in wrong_method.json()["error"]["message"]


async def _until(predicate, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def _until_async(predicate, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_other_web_pages_cannot_drive_the_local_api(stack, http, llm):
    # A cross-site form or fetch without a CORS preflight can only send "simple" content types.
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        answer = await http.post("/v1/sessions/victim/chat", content=b'{"message": "rm -rf ~"}',
                                 headers={"Content-Type": content_type})
        assert answer.status_code == 400 and "Content-Type: application/json" in answer.json()["error"]["message"]
    assert llm.requests == []
    assert (await http.get("/v1/sessions/victim")).status_code == 404  # no turn, no session
    # DNS rebinding: a page of another name that resolves to 127.0.0.1 is refused, console included.
    for path in ("/v1/sessions", "/"):
        rebound = await http.get(path, headers={"Host": f"attacker.example:{stack.http_url.rsplit(':', 1)[1]}"})
        assert rebound.status_code == 403 and rebound.json()["error"]["code"] == "PERMISSION_DENIED"
    assert (await http.get("/v1/sessions", headers={"Host": "localhost"})).status_code == 200


async def test_cron_jobs_are_created_listed_triggered_and_deleted_over_http(http, llm):
    llm.add(reply("Report written."))
    created = await http.post("/v1/cron/jobs", json={"job": {"name": "nightly", "schedule": "daily 09:00", "prompt": "write the report"}})
    assert created.status_code == 200, created.text
    job = created.json()
    assert job["name"] == "nightly" and job["job_id"]

    listed = await http.get("/v1/cron/jobs")
    assert [j["job_id"] for j in listed.json()["jobs"]] == [job["job_id"]]
    assert (await http.get(f"/v1/cron/jobs/{job['job_id']}")).json()["schedule"] == "daily 09:00"

    renamed = await http.patch("/v1/cron/jobs", json={"job": {"job_id": job["job_id"], "name": "daily"}, "update_mask": ["name"]})
    assert renamed.status_code == 200 and renamed.json()["name"] == "daily"
    toggled = await http.post(f"/v1/cron/jobs/{job['job_id']}/toggle", json={})
    assert toggled.status_code == 200 and toggled.json().get("enabled", False) is False

    run = await http.post(f"/v1/cron/jobs/{job['job_id']}/trigger", json={})
    assert run.status_code == 200 and run.json()["job_id"] == job["job_id"]
    async for _ in polling(0.1):
        runs = (await http.get(f"/v1/cron/jobs/{job['job_id']}/runs", params={"limit": 5})).json().get("runs", [])
        if runs and runs[0]["status"] != "running":
            break
    assert runs[0]["status"] == "succeeded" and runs[0]["summary"] == "Report written."

    bad = await http.post("/v1/cron/jobs", json={"job": {"name": "x", "schedule": "whenever", "prompt": "p"}})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "INVALID_ARGUMENT"
    assert (await http.delete(f"/v1/cron/jobs/{job['job_id']}")).json() == {"deleted": True}
    assert (await http.get(f"/v1/cron/jobs/{job['job_id']}")).status_code == 404


async def test_tool_policies_modes_and_clearing_over_http(http, llm):
    put = await http.put("/v1/namespaces/team/settings", json={"tools": {"deny": ["shell"]}})
    assert put.status_code == 200 and put.json()["tools"]["deny"] == ["shell"]
    assert (await http.get("/v1/namespaces/team/settings")).json()["tools"]["deny"] == ["shell"]
    typo = await http.put("/v1/namespaces/team/settings", json={"tools": {"deny": ["shel"]}})
    assert typo.status_code == 400 and "no tool named 'shel'" in typo.json()["error"]["message"]

    in_team = {tool["name"] for tool in (await http.get("/v1/tools", params={"namespace": "team"})).json()["tools"]}
    assert "shell" not in in_team and "read_file" in in_team
    read_only = {tool["name"] for tool in (await http.get("/v1/tools")).json()["tools"] if tool.get("read_only")}
    assert {"read_file", "grep"} <= read_only and "write_file" not in read_only

    await http.post("/v1/sessions", json={"session_id": "pol", "namespace": "team"})
    patched = await http.patch("/v1/sessions/pol", json={"permission_mode": "normal"})
    assert patched.status_code == 200 and patched.json()["permission_mode"] == "normal"
    bad = await http.patch("/v1/sessions/pol", json={"permission_mode": "yolo"})
    assert bad.status_code == 400 and "auto, normal or manual" in bad.json()["error"]["message"]

    llm.add(reply("Hi."))
    assert (await stream(http, "pol", {"message": "hello"})).status == 200
    cleared = await http.delete("/v1/sessions/pol/transcript")
    assert cleared.status_code == 200 and cleared.json() == {"cleared": "2"}  # int64 is a JSON string
    assert (await http.get("/v1/sessions/pol/transcript")).json().get("messages", []) == []
