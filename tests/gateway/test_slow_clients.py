"""Slow, idle and greedy clients are let go: raw sockets against the gateway's HTTP server and the
services' gRPC ports, the stack started with short timeouts so the test needs no long wait (no
test asserts how fast: only that the connection is closed, and what it was told)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from tests.support.stack import Stack

SLOW = {
    "AGENTMESH_GATEWAY_HTTP_HEADER_TIMEOUT_S": "1",
    "AGENTMESH_GATEWAY_HTTP_BODY_TIMEOUT_S": "1",
    "AGENTMESH_GATEWAY_HTTP_IDLE_TIMEOUT_S": "1",
    "AGENTMESH_GRPC_MAX_CONNECTION_IDLE_S": "1",
    "AGENTMESH_GRPC_HANDSHAKE_TIMEOUT_S": "1",
}
# An HTTP/2 client's first bytes: the preface and an empty SETTINGS frame.
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000")


@pytest.fixture
async def stack(tmp_path, llm):
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=SLOW) as running:
        yield running


def _address(target: str) -> tuple[str, int]:
    host, _, port = target.rpartition(":")
    return host, int(port)


async def _until_closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends, once it has closed the connection."""
    received = b""
    while chunk := await reader.read(65536):
        received += chunk
    return received


async def _trickle(writer: asyncio.StreamWriter, data: bytes, pause_s: float = 0.2) -> None:
    """Send `data` a byte at a time, as a slowloris client does, until the server hangs up."""
    with contextlib.suppress(ConnectionError):
        for byte in data:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(pause_s)


async def _slow_request(stack, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection(*_address(stack.hosts["gateway"].endpoints["http"]))
    sender = asyncio.create_task(_trickle(writer, data))
    try:
        return await _until_closed(reader)
    finally:
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sender
        writer.close()


@pytest.mark.timeout(120)
async def test_a_slow_header_client_is_told_and_disconnected(stack):
    # Headers that never end, a byte at a time; no credentials needed to send them.
    answer = await _slow_request(stack, b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 100_000)
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert b"AGENTMESH_GATEWAY_HTTP_HEADER_TIMEOUT_S" in answer


@pytest.mark.timeout(120)
async def test_a_slow_body_is_refused_and_the_connection_closed(stack):
    head = (b"POST /v1/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000\r\n\r\n")
    reader, writer = await asyncio.open_connection(*_address(stack.hosts["gateway"].endpoints["http"]))
    writer.write(head)  # the head at once, then the body a byte at a time
    sender = asyncio.create_task(_trickle(writer, b"{" + b" " * 99_999))
    try:
        answer = await _until_closed(reader)
    finally:
        sender.cancel()
        writer.close()
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert b"AGENTMESH_GATEWAY_HTTP_BODY_TIMEOUT_S" in answer


@pytest.mark.timeout(120)
async def test_an_idle_kept_alive_connection_is_closed_and_a_quick_client_is_served(stack):
    reader, writer = await asyncio.open_connection(*_address(stack.hosts["gateway"].endpoints["http"]))
    writer.write(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    try:
        answer = await _until_closed(reader)  # answered, then left idle: closed
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    assert b'"models"' in answer


@pytest.mark.timeout(120)
async def test_idle_grpc_connections_are_reaped(stack):
    async def idle(service: str, first_bytes: bytes) -> None:
        reader, writer = await asyncio.open_connection(*_address(stack.addresses[service]))
        writer.write(first_bytes)
        try:
            await _until_closed(reader)
        finally:
            writer.close()

    # All six side by side: each waits out the same idle timeout, none depends on another.
    await asyncio.gather(*(idle(service, first_bytes) for service in ("gateway", "memory", "tools")
                           for first_bytes in (b"", H2_PREFACE)))  # silent; or HTTP/2 that never calls


@pytest.mark.timeout(120)
async def test_one_address_holds_at_most_its_share_of_connections(tmp_path, llm):
    env = {"AGENTMESH_GATEWAY_HTTP_MAX_CONNECTIONS_PER_IP": "3"}
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=env) as stack:
        address = _address(stack.hosts["gateway"].endpoints["http"])
        held = [await asyncio.open_connection(*address) for _ in range(3)]
        reader, writer = await asyncio.open_connection(*address)
        answer = await _until_closed(reader)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 429 "), answer[:200]
        assert b"AGENTMESH_GATEWAY_HTTP_MAX_CONNECTIONS_PER_IP" in answer
        # One given back: once the server has seen it go, the next connection is served.
        held.pop()[1].close()
        for _ in range(100):
            reader, writer = await asyncio.open_connection(*address)
            writer.write(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            with contextlib.suppress(ConnectionError):
                answer = await _until_closed(reader)
            writer.close()
            if not answer.startswith(b"HTTP/1.1 429 "):
                break
            await asyncio.sleep(0.1)
        assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
        for _, other in held:
            other.close()
