"""Each namespace's agent as an A2A agent: the a2a-sdk client reads the card, sends a message,
streams the run, and cancels a task — over real HTTP on the gateway's address."""

from __future__ import annotations

import asyncio
import uuid

import httpx
from a2a.client import ClientConfig, create_client
from a2a.types import Message, Part, Role, SendMessageRequest, TaskState

from agentmesh.v1 import gateway_pb2, sessions_pb2
from tests.protocols.conftest import TOKEN
from tests.support.llm_server import reply, tool_call

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def user_message(text: str, context_id: str = "") -> SendMessageRequest:
    return SendMessageRequest(message=Message(role=Role.ROLE_USER, message_id=uuid.uuid4().hex,
                                              context_id=context_id, parts=[Part(text=text)]))


async def a2a_client(base: str, *, streaming: bool = True, headers: dict | None = None):
    http = httpx.AsyncClient(headers=headers if headers is not None else AUTH, timeout=60)
    return await create_client(base, client_config=ClientConfig(streaming=streaming, httpx_client=http)), http


async def test_the_default_agent_card_describes_the_agent_its_tools_and_its_auth(stack):
    async with httpx.AsyncClient(timeout=30) as http:
        public = await http.get(f"{stack.http_url}/.well-known/agent-card.json")  # discovery needs no token
        answer = await http.get(f"{stack.http_url}/.well-known/agent-card.json", headers=AUTH)
    assert public.status_code == 200 and answer.status_code == 200
    # The namespace's tools are listed to a caller who may see it, not to anyone who asks.
    assert {s["name"] for s in public.json()["skills"]} == {"chat"}
    card = answer.json()
    assert card["supportedInterfaces"][0]["url"] == f"{stack.http_url}/a2a/default/"
    assert card["supportedInterfaces"][0]["protocolBinding"] == "JSONRPC"
    assert card["capabilities"]["streaming"] is True
    skills = {s["name"] for s in card["skills"]}
    assert {"chat", "shell", "write_file", "web_fetch"} <= skills
    assert card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"] == "Bearer"
    assert card["securityRequirements"] == [{"schemes": {"bearer": {}}}]


async def test_the_a2a_client_streams_a_tool_using_run_of_a_namespaces_agent(stack, llm):
    llm.add(reply("Writing.", tool_call("write_file", {"path": "n.txt", "content": "hi"}, id="c1")),
            reply("Done: n.txt written."))
    client, http = await a2a_client(f"{stack.http_url}/a2a/team-a")
    try:
        updates = [update async for update in client.send_message(user_message("write a note", "ctx-team-a-1"))]
    finally:
        await client.close()
        await http.aclose()

    kinds = [u.WhichOneof("payload") for u in updates]
    assert kinds[0] == "task" and "artifact_update" in kinds
    states = [u.status_update.status.state for u in updates if u.HasField("status_update")]
    assert states[-1] == TaskState.TASK_STATE_COMPLETED
    assert TaskState.TASK_STATE_WORKING in states
    said = [u.status_update.status.message.parts[0].text for u in updates
            if u.HasField("status_update") and u.status_update.status.message.parts]
    assert any(s.startswith("calling write_file") for s in said) and "write_file: ok" in said
    reply_text = "".join(p.text for u in updates if u.HasField("artifact_update") for p in u.artifact_update.artifact.parts)
    assert reply_text == "Writing.Done: n.txt written."

    # The context is an agentmesh session of the endpoint's namespace, with the run in its transcript.
    session = await stack.gateway_stub().GetSession(sessions_pb2.GetSessionRequest(session_id="ctx-team-a-1"),
                                                    metadata=(("authorization", f"Bearer {TOKEN}"),))
    assert session.namespace == "team-a" and session.message_count >= 4


async def test_message_send_without_streaming_answers_the_finished_task(stack, llm):
    llm.add(reply("Hello from agentmesh."))
    client, http = await a2a_client(stack.http_url, streaming=False)
    try:
        updates = [u async for u in client.send_message(user_message("hello"))]
    finally:
        await client.close()
        await http.aclose()
    task = updates[-1].task
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert "".join(p.text for p in task.artifacts[0].parts) == "Hello from agentmesh."


async def test_a2a_calls_need_the_gateways_token(stack):
    async with httpx.AsyncClient(timeout=30) as http:
        refused = await http.post(f"{stack.http_url}/a2a/default/", json={
            "jsonrpc": "2.0", "id": 1, "method": "SendMessage",
            "params": {"message": {"role": "ROLE_USER", "messageId": "m1", "parts": [{"text": "hi"}]}}},
            headers={"Authorization": "Bearer wrong"})
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "UNAUTHENTICATED"


async def test_a_malformed_namespace_is_refused(stack):
    async with httpx.AsyncClient(timeout=30) as http:
        answer = await http.get(f"{stack.http_url}/a2a/bad%20name/.well-known/agent-card.json")
    assert answer.status_code == 400 and "namespace" in answer.json()["error"]["message"]


async def test_cancelling_the_task_cancels_the_turn(stack, llm):
    llm.add(reply("", tool_call("shell", {"command": "sleep 30"}, id="c1")))
    client, http = await a2a_client(stack.http_url)
    updates = []
    try:
        async for update in client.send_message(user_message("sleep", "ctx-cancel")):
            updates.append(update)
            if update.HasField("status_update") and update.status_update.status.message.parts and \
                    update.status_update.status.message.parts[0].text.startswith("calling shell"):
                from a2a.types import CancelTaskRequest

                task_id = update.status_update.task_id
                cancelled = await asyncio.wait_for(client.cancel_task(CancelTaskRequest(id=task_id)), 30)
                assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
                break
    finally:
        await client.close()
        await http.aclose()
    # The gateway's turn stopped (not after the 30 s sleep): the session takes a new turn.
    llm.add(reply("again"))
    stub = stack.gateway_stub()
    metadata = (("authorization", f"Bearer {TOKEN}"),)
    for _ in range(50):
        events = []
        try:
            async for event in stub.Chat(gateway_pb2.ChatRequest(session_id="ctx-cancel", message="again"), metadata=metadata):
                events.append(event)
            break
        except Exception:  # noqa: BLE001 - FAILED_PRECONDITION while the cancelled turn winds down
            await asyncio.sleep(0.1)
    assert events[-1].run_finished.final_text == "again"


async def test_plain_json_rpc_in_both_protocol_versions(stack, llm):
    """What the docs' curl examples send: A2A 1.0's SendMessage, and 0.3's message/send."""
    llm.add(reply("one"), reply("two"))
    async with httpx.AsyncClient(timeout=60, headers=AUTH) as http:
        current = await http.post(f"{stack.http_url}/a2a/default/", headers={"A2A-Version": "1.0"}, json={
            "jsonrpc": "2.0", "id": 1, "method": "SendMessage",
            "params": {"message": {"role": "ROLE_USER", "messageId": "m1", "contextId": "plain",
                                   "parts": [{"text": "first"}]}}})
        legacy = await http.post(f"{stack.http_url}/a2a/default/", json={
            "jsonrpc": "2.0", "id": 2, "method": "message/send",
            "params": {"message": {"role": "user", "messageId": "m2", "contextId": "plain", "kind": "message",
                                   "parts": [{"kind": "text", "text": "second"}]}}})
    assert current.status_code == 200, current.text
    assert "result" in current.json(), current.json()
    task = current.json()["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED" and task["contextId"] == "plain"
    assert legacy.status_code == 200, legacy.text
    assert "result" in legacy.json(), legacy.json()
    old = legacy.json()["result"]
    assert old["kind"] == "task" and old["status"]["state"] == "completed"
    assert "".join(p["text"] for p in old["artifacts"][0]["parts"]) == "two"


async def test_the_turn_joins_the_a2a_callers_trace(stack, llm):
    llm.add(reply("traced"))
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    headers = {**AUTH, "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}
    client, http = await a2a_client(stack.http_url, headers=headers)
    try:
        updates = [u async for u in client.send_message(user_message("trace me"))]
    finally:
        await client.close()
        await http.aclose()
    traced = [u.status_update.metadata["agentmesh_trace_id"] for u in updates
              if u.HasField("status_update") and "agentmesh_trace_id" in u.status_update.metadata]
    assert traced and set(traced) == {trace_id}


async def test_a_task_run_by_one_gateway_replica_is_read_on_another(stack, llm):
    """tasks/get on a replica that did not run the task: each replica's task store writes its
    tasks through to the memory service, and reads there what it does not hold."""
    from a2a.types import GetTaskRequest

    from agentmesh.rpc.launch import start_service

    other = await start_service("gateway", stack.settings, "127.0.0.1:0")
    try:
        llm.add(reply("Hello from replica one."))
        client, http = await a2a_client(stack.http_url, streaming=False)
        try:
            updates = [u async for u in client.send_message(user_message("hello", "ctx-replicas"))]
        finally:
            await client.close()
            await http.aclose()
        task_id = updates[-1].task.id

        client, http = await a2a_client(f"http://{other.endpoints['http']}/a2a/default")
        try:
            task = await client.get_task(GetTaskRequest(id=task_id))
        finally:
            await client.close()
            await http.aclose()
        assert task.id == task_id and task.context_id == "ctx-replicas"
        assert task.status.state == TaskState.TASK_STATE_COMPLETED
        assert "".join(p.text for p in task.artifacts[0].parts) == "Hello from replica one."
        # Another namespace's endpoint does not know it.
        client, http = await a2a_client(f"http://{other.endpoints['http']}/a2a/team-b")
        try:
            missing = None
            try:
                await client.get_task(GetTaskRequest(id=task_id))
            except Exception as exc:  # noqa: BLE001 - the SDK's task-not-found error
                missing = exc
        finally:
            await client.close()
            await http.aclose()
        assert missing is not None and "not found" in str(missing).lower()
    finally:
        await other.stop(grace=1)
        other.telemetry.shutdown()


async def test_each_named_agent_has_its_own_card_and_runs_its_turns(stack, llm):
    from agentmesh.v1 import agents_pb2

    await stack.gateway_stub().CreateAgent(agents_pb2.CreateAgentRequest(namespace="team-a", spec=agents_pb2.AgentSpec(
        name="reviewer", description="Reviews changes for risk.", instructions="You are REVIEWER; find the risk.")),
        metadata=(("authorization", AUTH["Authorization"]),))
    async with httpx.AsyncClient(timeout=30) as http:
        card = (await http.get(f"{stack.http_url}/a2a/team-a/reviewer/.well-known/agent-card.json", headers=AUTH)).json()
        missing = await http.get(f"{stack.http_url}/a2a/team-a/nobody/.well-known/agent-card.json", headers=AUTH)
    assert card["name"] == "reviewer (agentmesh team-a)" and card["description"] == "Reviews changes for risk."
    assert card["supportedInterfaces"][0]["url"] == f"{stack.http_url}/a2a/team-a/reviewer/"
    assert missing.status_code == 404 and "nobody" in missing.json()["error"]["message"]

    llm.add(reply("Risky: the migration."))
    client, http = await a2a_client(f"{stack.http_url}/a2a/team-a/reviewer", streaming=False)
    try:
        updates = [u async for u in client.send_message(user_message("review this", "ctx-reviewer-1"))]
    finally:
        await client.close()
        await http.aclose()
    task = updates[-1].task
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    (request,) = llm.requests
    assert "You are REVIEWER" in request.messages[0]["content"]
    session = await stack.gateway_stub().GetSession(sessions_pb2.GetSessionRequest(session_id="ctx-reviewer-1"),
                                                    metadata=(("authorization", AUTH["Authorization"]),))
    assert (session.namespace, session.agent, session.agent_version) == ("team-a", "reviewer", 1)
