"""The OpenAPI document against what the server does, and bearer-token authentication over HTTP."""

from __future__ import annotations

import re

import grpc
import httpx
import jsonschema
import pytest

from agentmesh.v1 import gateway_pb2, scheduler_pb2, sessions_pb2
from tests.support.llm_server import reply
from tests.support.stack import Stack
from tests.web.conftest import stream

TOKEN = "web-test-token-0123456789"


async def test_the_document_lists_every_public_rpc_once(http):
    document = (await http.get("/openapi.json")).json()
    assert document["openapi"].startswith("3.1")
    operations = [op["operationId"] for path in document["paths"].values() for op in path.values()]
    rpcs = [m.name for m in gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].methods]
    # A scheduler method named like a gateway one is qualified by its service (Scheduler.ListRuns).
    rpcs += [m.name if m.name not in rpcs else f"Scheduler.{m.name}"
             for m in scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].methods]
    assert sorted(operations) == sorted(rpcs)


async def test_every_documented_route_is_served(http):
    document = (await http.get("/openapi.json")).json()
    for path, operations in document["paths"].items():
        url = re.sub(r"\{[a-z_]+\}", "x", path)
        for method in operations:
            # Streamed: a stream that never ends by itself (GET /v1/activity) answers its head at once.
            async with http.stream(method.upper(), url, json={} if method in ("post", "put") else None) as answer:
                # Whatever the call itself says (404 for session 'x', 400, ...), the route exists.
                assert answer.status_code != 405, (method, path)
                if answer.status_code == 404:
                    await answer.aread()
                    assert "no route" not in answer.json()["error"]["message"], (method, path)
    undocumented = await http.get("/v1/sessions/x/secrets")
    assert undocumented.status_code == 404 and "no route" in undocumented.json()["error"]["message"]


async def test_responses_match_the_documented_schemas(http, llm):
    document = (await http.get("/openapi.json")).json()

    def check(path: str, method: str, body) -> None:
        schema = document["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"]
        jsonschema.validate(body, {**schema, "components": document["components"]})

    check("/v1/sessions", "post", (await http.post("/v1/sessions", json={"session_id": "d", "labels": {"k": "v"}})).json())
    check("/v1/sessions/{session_id}", "get", (await http.get("/v1/sessions/d")).json())
    check("/v1/sessions", "get", (await http.get("/v1/sessions")).json())
    check("/v1/tools", "get", (await http.get("/v1/tools")).json())
    llm.add(reply("Hello."))
    await stream(http, "d", {"message": "hello"})
    check("/v1/sessions/{session_id}/transcript", "get", (await http.get("/v1/sessions/d/transcript")).json())
    check("/v1/sessions/{session_id}/workspace", "get", (await http.get("/v1/sessions/d/workspace")).json())
    # A field the server does not send is not in the document either (additionalProperties: false).
    with pytest.raises(jsonschema.ValidationError):
        check("/v1/sessions/{session_id}", "get", {"session_id": "d", "owner": "someone"})


async def test_request_bodies_are_documented_with_the_proto_fields(http):
    document = (await http.get("/openapi.json")).json()
    chat = document["paths"]["/v1/sessions/{session_id}/chat"]["post"]
    body = chat["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    properties = document["components"]["schemas"][body]["properties"]
    assert set(properties) == {"message", "options", "images"}
    # An image's bytes are base64 in JSON, as the schema says.
    image = document["components"]["schemas"][properties["images"]["items"]["$ref"].rsplit("/", 1)[1]]
    assert image["properties"]["data"] == {"type": "string", "contentEncoding": "base64"}
    assert "text/event-stream" in chat["responses"]["200"]["content"]
    assert any(p["name"] == "Last-Event-ID" and p["in"] == "header" for p in chat["parameters"])
    listing = document["paths"]["/v1/sessions"]["get"]
    assert {p["name"] for p in listing["parameters"]} == {"page_size", "page_token"}


@pytest.fixture
async def secured(tmp_path, llm):
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env={"AGENTMESH_AUTH_TOKENS": TOKEN}) as running:
        async with httpx.AsyncClient(base_url=running.http_url, timeout=30) as client:
            yield running, client


async def test_without_a_valid_token_nothing_is_answered(secured):
    stack, http = secured
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
        # The gateway's own check answers, with the sentence a gRPC client gets for the same credentials.
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stack.gateway_stub().ListSessions(sessions_pb2.ListSessionsRequest(), timeout=10,
                                                    metadata=tuple((k.lower(), v) for k, v in headers.items()))
        answer = await http.get("/v1/sessions", headers=headers)
        assert answer.status_code == 401
        assert answer.json()["error"] == {"code": "UNAUTHENTICATED", "message": refused.value.details(), "http_status": 401,
                                          "reason": "UNAUTHENTICATED", "domain": "agentmesh.dev",
                                          "metadata": {"method": "/agentmesh.v1.Gateway/ListSessions"}}
        assert answer.headers["WWW-Authenticate"].startswith("Bearer")
    chat = await http.post("/v1/sessions/s/chat", json={"message": "hi"})
    assert chat.status_code == 401 and chat.headers["content-type"].startswith("application/json")
    resume = await http.post("/v1/sessions/s/chat", json={}, headers={"Last-Event-ID": "0"})
    assert resume.status_code == 401
    upload = await http.put("/v1/sessions/s/workspace/file", json={"path": "x", "content": ""})
    assert upload.status_code == 401
    # Cron jobs are answered by the scheduler, which checks the same user tokens.
    jobs = await http.get("/v1/cron/jobs", headers={"Authorization": "Bearer wrong"})
    assert jobs.status_code == 401 and jobs.json()["error"]["code"] == "UNAUTHENTICATED"
    created = await http.post("/v1/cron/jobs", json={"job": {"name": "n", "schedule": "every 1h", "prompt": "p"}})
    assert created.status_code == 401


async def test_with_the_token_calls_are_answered(secured, llm):
    _, http = secured
    llm.add(reply("Hello."))
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert (await http.post("/v1/sessions", json={"session_id": "ok"}, headers=auth)).status_code == 200
    assert [s["session_id"] for s in (await http.get("/v1/sessions", headers=auth)).json()["sessions"]] == ["ok"]
    streamed = await stream(http, "ok", {"message": "hello"}, headers=auth)
    assert streamed.status == 200 and streamed.kinds[-1] == "run_finished"
    job = await http.post("/v1/cron/jobs", json={"job": {"name": "n", "schedule": "every 1h", "prompt": "p"}}, headers=auth)
    assert job.status_code == 200 and job.json()["name"] == "n"


async def test_the_console_and_the_document_need_no_token(secured):
    _, http = secured
    page = await http.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["Content-Security-Policy"]
    assert (await http.get("/openapi.json")).status_code == 200
