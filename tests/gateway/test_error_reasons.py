"""Every error the gateway answers carries a reason a program can act on: a google.rpc.ErrorInfo
in the gRPC status details (read here as clients read it, with grpcio-status) and the same
reason, domain and metadata in the HTTP error body — whether the error arose in the gateway's
core, in its interceptor, or in a peer service behind it."""

from __future__ import annotations

import asyncio
import base64
import json
import threading

import grpc
import httpx
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from agentmesh import error_reasons
from agentmesh.internal.v1 import agent_service_pb2, agent_service_pb2_grpc
from agentmesh.rpc.auth import bearer_metadata
from agentmesh.v1 import common_pb2, gateway_pb2, sessions_pb2, tools_pb2
from tests.support.llm_server import failure, reply
from tests.support.stack import Stack
from tests.support.turns import collect, of_kind

TOKEN = "reasons-test-token-0123456789"
AUTH = bearer_metadata(TOKEN)
HTTP_AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def stack(tmp_path, llm):
    # Tokens on, so an unauthenticated call can be made; a 1 MiB workspace quota, so an upload
    # can pass it (the refusal comes from the tools service, behind the gateway).
    env = {"AGENTMESH_AUTH_TOKENS": TOKEN, "AGENTMESH_TOOLS_WORKSPACE_QUOTA_MB": "1"}
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=env) as running:
        yield running


async def refusal(call) -> grpc.aio.AioRpcError:
    """The status a unary call, or a stream before its first message, was refused with."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await (collect(call) if hasattr(call, "__aiter__") else call)
    return info.value


def error_info(err: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo:
    """The ErrorInfo of a status, as a client reads it."""
    status = rpc_status.from_call(err)
    assert status is not None, f"{err.code().name} {err.details()!r} carries no status details"
    assert status.code == err.code().value[0] and status.message == err.details()
    infos = [info for detail in status.details if detail.Unpack(info := error_details_pb2.ErrorInfo())]
    assert len(infos) == 1, status
    assert infos[0].domain == error_reasons.DOMAIN
    return infos[0]


def http_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()["error"]
    assert body["domain"] == error_reasons.DOMAIN and body["http_status"] == status
    return body


def chat(session_id: str, message: str = "hi", **options) -> gateway_pb2.ChatRequest:
    return gateway_pb2.ChatRequest(session_id=session_id, message=message, options=gateway_pb2.ChatOptions(**options))


async def test_a_busy_session_is_session_busy(stack, llm):
    gateway = stack.gateway_stub()
    # The first turn's model call is held until the refusals below are checked: busy for as long
    # as the checks take, however loaded the machine (a bound only so a failing test ends).
    released = threading.Event()

    def held(request):
        released.wait(120)
        return reply("slow answer")

    llm.add(held)
    first = asyncio.ensure_future(collect(gateway.Chat(chat("busy", "first"), metadata=AUTH, timeout=180)))
    try:
        await asyncio.to_thread(llm.wait_for_requests, 1, 60)

        err = await refusal(gateway.Chat(chat("busy", "second"), metadata=AUTH, timeout=30))
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
        info = error_info(err)
        assert info.reason == "SESSION_BUSY" and dict(info.metadata) == {"session_id": "busy"}
        err = await refusal(gateway.DeleteSession(sessions_pb2.DeleteSessionRequest(session_id="busy"), metadata=AUTH,
                                                  timeout=30))
        assert error_info(err).reason == "SESSION_BUSY"

        async with httpx.AsyncClient(base_url=stack.http_url, headers=HTTP_AUTH, timeout=30) as client:
            body = http_error(await client.post("/v1/sessions/busy/chat", json={"message": "third"}), 409)
        assert body["code"] == "FAILED_PRECONDITION" and body["reason"] == "SESSION_BUSY"
        assert body["metadata"] == {"session_id": "busy"} and "already running a turn" in body["message"]
    finally:
        released.set()
    await first


async def test_a_session_that_does_not_exist_is_not_found(stack):
    gateway = stack.gateway_stub()
    # The refusal is the memory service's: its reason crosses the hop to the gateway's client.
    err = await refusal(gateway.GetSession(sessions_pb2.GetSessionRequest(session_id="nope"), metadata=AUTH, timeout=10))
    assert err.code() == grpc.StatusCode.NOT_FOUND and error_info(err).reason == "NOT_FOUND"

    async with httpx.AsyncClient(base_url=stack.http_url, headers=HTTP_AUTH, timeout=30) as client:
        body = http_error(await client.get("/v1/sessions/nope"), 404)
    assert body["code"] == "NOT_FOUND" and body["reason"] == "NOT_FOUND"
    assert body["message"] == err.details()


async def test_an_invalid_argument_names_its_field(stack, llm):
    gateway = stack.gateway_stub()
    err = await refusal(gateway.Chat(chat("s1", max_iterations=-1), metadata=AUTH, timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    info = error_info(err)
    assert info.reason == "INVALID_ARGUMENT" and dict(info.metadata) == {"field": "options.max_iterations"}
    # And as Google's APIs do, a BadRequest naming the field.
    violations = [v for detail in rpc_status.from_call(err).details
                  if detail.Unpack(bad := error_details_pb2.BadRequest()) for v in bad.field_violations]
    assert [v.field for v in violations] == ["options.max_iterations"]

    err = await refusal(gateway.Chat(chat("s1", model="no-such-model"), metadata=AUTH, timeout=10))
    info = error_info(err)
    assert info.reason == "UNKNOWN_MODEL" and dict(info.metadata) == {"field": "options.model", "model": "no-such-model"}

    async with httpx.AsyncClient(base_url=stack.http_url, headers=HTTP_AUTH, timeout=30) as client:
        body = http_error(await client.post("/v1/sessions/s1/chat", json={"message": ""}), 400)
        assert body["reason"] == "INVALID_ARGUMENT" and body["metadata"] == {"field": "message"}
        # Refused by the HTTP layer itself, before any RPC: the same shape.
        body = http_error(await client.post("/v1/sessions", content=b"{not json", headers={"Content-Type": "application/json"}), 400)
        assert body["reason"] == "MALFORMED_REQUEST"
        body = http_error(await client.post("/v1/sessions", json={"sesion_id": "typo"}), 400)
        assert body["reason"] == "INVALID_ARGUMENT" and body["metadata"] == {"field": "sesion_id"}
    assert llm.requests == []


async def test_a_request_that_is_not_protobuf_is_malformed_request(stack):
    # Raw bytes that do not decode as a ChatRequest: refused by the server's interceptor.
    method = stack.user_channel("gateway").unary_unary("/agentmesh.v1.Gateway/GetSession")
    err = await refusal(method(b"\xff\xff\xff", metadata=AUTH, timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and error_info(err).reason == "MALFORMED_REQUEST"


async def test_a_call_without_a_token_is_unauthenticated(stack):
    gateway = stack.gateway_stub()
    err = await refusal(gateway.ListSessions(sessions_pb2.ListSessionsRequest(), timeout=10))
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    info = error_info(err)
    assert info.reason == "UNAUTHENTICATED" and dict(info.metadata) == {"method": "/agentmesh.v1.Gateway/ListSessions"}

    async with httpx.AsyncClient(base_url=stack.http_url, timeout=30) as client:
        response = await client.get("/v1/sessions")
        body = http_error(response, 401)
    assert body["reason"] == "UNAUTHENTICATED" and response.headers["WWW-Authenticate"].startswith("Bearer")


async def test_a_user_calling_an_internal_method_is_permission_denied(stack):
    agent = agent_service_pb2_grpc.AgentStub(stack.user_channel("agent"))
    request = agent_service_pb2.RunTurnRequest(session_id="s1", message="hi")

    async def requests():
        yield request

    err = await refusal(agent.RunTurn(requests(), metadata=AUTH, timeout=10))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert error_info(err).reason == "PERMISSION_DENIED"


async def test_a_tool_policy_naming_no_tool_is_unknown_tool(stack):
    gateway = stack.gateway_stub()
    request = sessions_pb2.UpdateNamespaceSettingsRequest(
        namespace="default", tools=common_pb2.ToolPolicy(deny=["shel"]))
    err = await refusal(gateway.UpdateNamespaceSettings(request, metadata=AUTH, timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    info = error_info(err)
    assert info.reason == "UNKNOWN_TOOL" and dict(info.metadata) == {"field": "tools.deny", "tool": "shel"}

    async with httpx.AsyncClient(base_url=stack.http_url, headers=HTTP_AUTH, timeout=30) as client:
        body = http_error(await client.put("/v1/namespaces/default/settings", json={"tools": {"allow": ["pythn"]}}), 400)
    assert body["reason"] == "UNKNOWN_TOOL" and body["metadata"] == {"field": "tools.allow", "tool": "pythn"}


async def test_an_approval_nothing_waits_for_is_approval_not_found(stack):
    gateway = stack.gateway_stub()
    await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id="quiet"), metadata=AUTH, timeout=10)
    request = gateway_pb2.ApproveRequest(session_id="quiet", call_id="call_1", approved=True)
    err = await refusal(gateway.Approve(request, metadata=AUTH, timeout=10))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    info = error_info(err)
    assert info.reason == "APPROVAL_NOT_FOUND" and dict(info.metadata) == {"session_id": "quiet", "call_id": "call_1"}


async def test_an_upload_past_the_workspace_quota_is_quota_exceeded(stack):
    gateway = stack.gateway_stub()
    await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id="full"), metadata=AUTH, timeout=10)
    big = b"x" * (1536 * 1024)  # 1.5 MiB against a 1 MiB quota
    request = tools_pb2.WriteWorkspaceFileRequest(session_id="full", path="big.bin", content=big)
    # Refused by the tools service; the reason and its figures reach the gateway's client.
    err = await refusal(gateway.WriteWorkspaceFile(request, metadata=AUTH, timeout=30))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    info = error_info(err)
    assert info.reason == "QUOTA_EXCEEDED"
    assert info.metadata["limit"] == "workspace_quota" and info.metadata["quota_bytes"] == str(1024 * 1024)
    assert int(info.metadata["usage_bytes"]) < 1024 * 1024  # what the (nearly empty) workspace holds

    async with httpx.AsyncClient(base_url=stack.http_url, headers=HTTP_AUTH, timeout=30) as client:
        body = http_error(await client.put("/v1/sessions/full/workspace/file",
                                           json={"path": "big.bin", "content": base64.b64encode(big).decode()}), 429)
    assert body["reason"] == "QUOTA_EXCEEDED" and body["metadata"]["limit"] == "workspace_quota"


async def test_a_turn_that_fails_after_it_started_says_why_in_its_error_event(stack, llm):
    # The model stays down: the agent's Unavailable ends the turn as an error event, not a status.
    llm.add(*[failure(503) for _ in range(8)])
    events = await collect(stack.gateway_stub().Chat(chat("down"), metadata=AUTH, timeout=60))
    error = of_kind(events, "error")[0]
    assert (error.code, error.reason) == ("UNAVAILABLE", "SERVICE_UNAVAILABLE")

    llm.add(*[failure(503) for _ in range(8)])
    async with httpx.AsyncClient(base_url=stack.http_url, headers=HTTP_AUTH, timeout=60) as client:
        response = await client.post("/v1/sessions/down/chat", json={"message": "again"})
    sent = [json.loads(line[len("data: "):]) for line in response.text.splitlines() if line.startswith("data: ")]
    errors = [event["error"] for event in sent if "error" in event]
    assert [(e["code"], e["reason"]) for e in errors] == [("UNAVAILABLE", "SERVICE_UNAVAILABLE")]


async def test_the_a2a_and_mcp_endpoints_see_the_reason_of_what_they_call(stack):
    # They run turns through the gateway's own gRPC API (http/loopback.py): its errors keep their reasons.
    from agentmesh.errors import AgentmeshError
    from agentmesh.gateway.http.loopback import GatewayCalls

    calls = GatewayCalls(stack.gateway_stub())
    with pytest.raises(AgentmeshError) as refused_:
        await calls.open_session("bad id!", "default", "", f"Bearer {TOKEN}")
    failure = refused_.value
    assert (failure.code, failure.reason, failure.metadata) == ("INVALID_ARGUMENT", "INVALID_ARGUMENT", {"field": "session_id"})
