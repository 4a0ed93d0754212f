"""The spans of a gRPC call (telemetry/rpcspans.py): a CLIENT span where it leaves, a SERVER
span where it arrives, one trace, the final status on both — and a traced call can still be
cancelled, the cancellation reaching the server."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from opentelemetry.trace import SpanKind, StatusCode

from agentmesh.config import Settings
from agentmesh.errors import NotFound
from agentmesh.rpc.client import open_channel
from agentmesh.rpc.errors import translate_errors
from agentmesh.rpc.server import ServiceHost
from agentmesh.telemetry.instruments import RPC_SERVER_DURATION
from agentmesh.v1 import gateway_pb2, gateway_pb2_grpc, sessions_pb2
from tests.observability.obs_helpers import memory_telemetry, metric_points
from tests.support.timing import polling


class SlowGateway(gateway_pb2_grpc.GatewayServicer):
    def __init__(self):
        self.started = asyncio.Event()

    @translate_errors
    async def CreateSession(self, request, context):
        if request.session_id == "slow":
            self.started.set()
            await asyncio.sleep(30)
        return sessions_pb2.Session(session_id=request.session_id)

    @translate_errors
    async def GetSession(self, request, context):
        raise NotFound(f"no session {request.session_id!r}")

    async def Cancel(self, request, context):  # no translate_errors: a bare crash
        raise RuntimeError("boom")


@pytest.fixture
async def traced(tmp_path):
    server_telemetry, server_spans, reader = memory_telemetry("gateway")
    client_telemetry, client_spans, _ = memory_telemetry("scheduler")
    host = ServiceHost("gateway", Settings.from_env({"AGENTMESH_HOME": str(tmp_path)}), server_telemetry,
                       address="127.0.0.1:0")
    servicer = SlowGateway()
    host.add(gateway_pb2_grpc.add_GatewayServicer_to_server, servicer, "agentmesh.v1.Gateway")
    await host.start()
    channel = open_channel(host.target, client_telemetry)
    try:
        yield gateway_pb2_grpc.GatewayStub(channel), servicer, client_spans, server_spans, reader
    finally:
        await channel.close()
        await host.stop(grace=0)


async def only(spans, kind):
    """The one finished span of `kind`, once it has finished: the server ends its span after it
    has sent the status, so the caller may have its answer first."""
    async for _ in polling():
        if found := [s for s in spans.get_finished_spans() if s.kind == kind]:
            break
    assert len(found) == 1, found
    return found[0]


async def test_a_call_is_a_client_span_and_its_server_child_in_one_trace(traced):
    stub, _, client_spans, server_spans, _ = traced
    await stub.CreateSession(gateway_pb2.CreateSessionRequest(session_id="a"))
    client, server = await only(client_spans, SpanKind.CLIENT), await only(server_spans, SpanKind.SERVER)
    assert client.name == server.name == "/agentmesh.v1.Gateway/CreateSession"
    assert server.context.trace_id == client.context.trace_id
    assert server.parent is not None and server.parent.span_id == client.context.span_id
    for span in (client, server):
        assert {k: span.attributes[k] for k in ("rpc.system", "rpc.service", "rpc.method", "rpc.grpc.status_code")} == {
            "rpc.system": "grpc", "rpc.service": "agentmesh.v1.Gateway", "rpc.method": "CreateSession",
            "rpc.grpc.status_code": 0}
        assert span.status.status_code == StatusCode.UNSET


async def test_a_callers_error_fails_the_client_span_but_not_the_server_span(traced):
    stub, _, client_spans, server_spans, _ = traced
    with pytest.raises(grpc.aio.AioRpcError):
        await stub.GetSession(sessions_pb2.GetSessionRequest(session_id="nope"))
    client, server = await only(client_spans, SpanKind.CLIENT), await only(server_spans, SpanKind.SERVER)
    assert client.attributes["rpc.grpc.status_code"] == server.attributes["rpc.grpc.status_code"] == 5
    assert client.status.status_code == StatusCode.ERROR and "no session 'nope'" in client.status.description
    # NOT_FOUND is the caller's mistake: the server did its job (OpenTelemetry RPC conventions).
    assert server.status.status_code == StatusCode.UNSET


async def test_a_crash_fails_both_spans(traced):
    stub, _, client_spans, server_spans, _ = traced
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Cancel(gateway_pb2.CancelRequest(session_id="s"))
    assert err.value.code() == grpc.StatusCode.UNKNOWN
    server = await only(server_spans, SpanKind.SERVER)
    assert server.status.status_code == StatusCode.ERROR
    assert [e.name for e in server.events] == ["exception"]
    assert (await only(client_spans, SpanKind.CLIENT)).status.status_code == StatusCode.ERROR


async def test_cancelling_a_traced_call_reaches_the_server(traced):
    stub, servicer, client_spans, _, reader = traced
    call = stub.CreateSession(gateway_pb2.CreateSessionRequest(session_id="slow"))
    waiting = asyncio.ensure_future(call)
    await asyncio.wait_for(servicer.started.wait(), 10)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting

    def cancelled():
        return [p for p in metric_points(reader, RPC_SERVER_DURATION)
                if p.attributes["rpc.method"] == "CreateSession"
                and p.attributes["rpc.grpc.status_code"] == grpc.StatusCode.CANCELLED.value[0]]

    async for _ in polling(0.025):  # the server sees the cancellation asynchronously
        if cancelled():
            break
    assert cancelled(), "the server never saw the call cancelled"
    client = await only(client_spans, SpanKind.CLIENT)
    assert client.attributes["rpc.grpc.status_code"] == grpc.StatusCode.CANCELLED.value[0]
