"""The gateway's HTTP API and web console, over real HTTP on a real port, in front of the
whole stack (five real gRPC services, the scripted model server)."""

from __future__ import annotations

import json

import httpx
import pytest
from httpx_sse import aconnect_sse

from agentmesh.tls import httpx_context
from tests.support.stack import Stack


@pytest.fixture
async def stack(tmp_path, llm):
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url) as running:
        yield running


@pytest.fixture
async def http(stack):
    # The shared CA bundle: loading one for each test's client cost more than its plain-HTTP requests.
    async with httpx.AsyncClient(base_url=stack.http_url, timeout=30, verify=httpx_context()) as client:
        yield client


class Streamed:
    """The SSE messages of one response: `id`, `event` and the parsed `data` of each."""

    def __init__(self) -> None:
        self.messages: list = []
        self.status = 0

    @property
    def ids(self) -> list[str]:
        return [m.id for m in self.messages]

    @property
    def kinds(self) -> list[str]:
        return [m.event for m in self.messages]

    def data(self, kind: str) -> list[dict]:
        return [json.loads(m.data)[kind] if kind != "message" else json.loads(m.data)
                for m in self.messages if m.event == kind]

    @property
    def text(self) -> str:
        return "".join(d["text"] for d in self.data("text_delta"))


async def stream(client: httpx.AsyncClient, session_id: str, body: dict | None = None, *,
                 last_event_id: str | None = None, until=None, headers: dict | None = None) -> Streamed:
    """POST a chat and read its events, stopping early (dropping the connection) when `until(message)`."""
    out = Streamed()
    sent = dict(headers or {})
    if last_event_id is not None:
        sent["Last-Event-ID"] = last_event_id
    async with aconnect_sse(client, "POST", f"/v1/sessions/{session_id}/chat", json=body or {}, headers=sent) as source:
        out.status = source.response.status_code
        async for message in source.aiter_sse():
            out.messages.append(message)
            if until is not None and until(message):
                break
    return out
