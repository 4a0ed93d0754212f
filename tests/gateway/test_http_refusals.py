"""Bad input over HTTP gets 400 and a sentence, never a 5xx, and only once the caller is known to
be let in: the whole stack with a user token, a real HTTP client."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.support.stack import Stack

TOKEN = "tok-http-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.fixture
async def stack(tmp_path, llm):
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env={"AGENTMESH_AUTH_TOKENS": TOKEN}) as running:
        yield running


async def test_a_deeply_nested_or_non_json_number_body_is_invalid_argument(stack):
    async with httpx.AsyncClient(base_url=stack.http_url, timeout=30, headers=AUTH) as http:
        for body in (b'{"session_id": ' + DEEP + b"}", DEEP, b'{"title": "x", "labels": {"a": NaN}}',
                     b'{"session_id": "s1", "title": Infinity}'):
            answer = await http.post("/v1/sessions", content=body, headers={"Content-Type": "application/json"})
            assert answer.status_code == 400, (body[:40], answer.text[:300])
            assert answer.json()["error"]["code"] == "INVALID_ARGUMENT"
        deep = await http.post("/v1/sessions", content=DEEP, headers={"Content-Type": "application/json"})
        assert "nests too deeply" in deep.json()["error"]["message"]
        # The protocol endpoints parse their own JSON-RPC: refused, not a server error.
        for path in ("/a2a/default/", "/mcp"):
            answer = await http.post(path, content=DEEP, headers={"Content-Type": "application/json",
                                                                 "Accept": "application/json, text/event-stream"})
            assert answer.status_code < 500, (path, answer.status_code, answer.text[:300])


async def test_last_event_id_is_an_id_this_server_sent_or_refused(stack):
    async with httpx.AsyncClient(base_url=stack.http_url, timeout=30, headers=AUTH) as http:
        assert (await http.post("/v1/sessions", json={"session_id": "s-resume"})).status_code == 200
        for bad in ("99999999999999999999", "1.99999999999999999999", "+5", "5.", ".5", "1_0", "٣",
                    "-1", "1.2.3", "0x10"):
            answer = await http.post("/v1/sessions/s-resume/chat", json={"message": "hi"},
                                     headers={"Last-Event-ID": bad.encode()})
            assert answer.status_code == 400, (bad, answer.text[:300])
            assert "Last-Event-ID" in answer.json()["error"]["message"]


async def test_the_host_header_is_read_strictly(stack):
    port = stack.hosts["gateway"].endpoints["http"].rpartition(":")[2]
    cases = {
        f"127.0.0.1:{port}": 200, "localhost": 200, f"[::1]:{port}": 200,
        "localhost:abc": 400, "localhost:99999": 400, "127.0.0.1:80:80": 400, "evil@127.0.0.1": 400, "": 400,
        "evil.example": 403, f"127.0.0.1.evil.example:{port}": 403,
    }
    for host, status in cases.items():
        answer = await _raw(stack, f"GET /v1/models HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
                                   f"Authorization: Bearer {TOKEN}\r\n\r\n".encode())
        assert answer.startswith(f"HTTP/1.1 {status} ".encode()), (host, answer[:300])
    two = await _raw(stack, f"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\n"
                            f"Connection: close\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode())
    assert b" 400 " in two.split(b"\r\n", 1)[0], two[:300]  # aiohttp's own parser refuses it


async def _raw(stack, request: bytes) -> bytes:
    host, _, port = stack.hosts["gateway"].endpoints["http"].rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(request)
    received = b""
    while chunk := await reader.read(65536):
        received += chunk
    writer.close()
    return received


async def test_a_caller_without_credentials_hears_401_before_any_400(stack):
    async with httpx.AsyncClient(base_url=stack.http_url, timeout=30) as http:
        for method, path, kwargs in (
            ("POST", "/v1/sessions", {"content": b"{not json", "headers": {"Content-Type": "application/json"}}),
            ("POST", "/v1/sessions", {"content": DEEP, "headers": {"Content-Type": "application/json"}}),
            ("POST", "/v1/sessions", {"content": b"{}", "headers": {"Content-Type": "text/plain"}}),
            ("POST", "/v1/sessions/bad%20id/chat", {"json": {"message": "hi"}}),
            ("GET", "/v1/sessions", {"params": {"page_size": "many"}}),
            ("GET", "/v1/usage", {"params": {"start": "nan"}}),
        ):
            for headers in ({}, {"Authorization": "Bearer wrong-token-0123"}):
                kwargs = {**kwargs, "headers": {**kwargs.get("headers", {}), **headers}}
                answer = await http.request(method, path, **kwargs)
                assert answer.status_code == 401, (method, path, headers, answer.text[:300])
                assert answer.json()["error"]["code"] == "UNAUTHENTICATED"
        # With the token, the same requests are the 400s they are.
        answer = await http.post("/v1/sessions", content=b"{not json", headers={**AUTH, "Content-Type": "application/json"})
        assert answer.status_code == 400 and "not valid JSON" in answer.json()["error"]["message"]
        answer = await http.get("/v1/usage", params={"start": "nan"}, headers=AUTH)
        assert answer.status_code == 400 and "finite" in answer.json()["error"]["message"]


async def test_the_openapi_document_gives_the_patterns_and_the_sse_messages(stack):
    async with httpx.AsyncClient(base_url=stack.http_url, timeout=30) as http:
        document = (await http.get("/openapi.json")).json()
    chat = document["paths"]["/v1/sessions/{session_id}/chat"]["post"]
    parameters = {p["name"]: p for p in chat["parameters"]}
    assert parameters["session_id"]["schema"]["pattern"] == "^[A-Za-z0-9._-]{1,128}$"
    assert parameters["Last-Event-ID"]["schema"]["pattern"] == r"^[0-9]{1,18}(\.[0-9]{1,18})?$"
    item = chat["responses"]["200"]["content"]["text/event-stream"]["itemSchema"]
    assert set(item["properties"]) == {"id", "event", "data"}
    assert {"run_started", "text_delta", "run_finished", "error", "message"} <= set(item["properties"]["event"]["enum"])
    refs = [d.get("$ref") for d in item["properties"]["data"]["oneOf"]]
    assert refs == ["#/components/schemas/Event", "#/components/schemas/Message", "#/components/schemas/Error"]
    schemas = document["components"]["schemas"]
    assert schemas["CreateSessionRequest"]["properties"]["namespace"]["pattern"] == "^(?:[A-Za-z0-9._:@-]{1,128})?$"
