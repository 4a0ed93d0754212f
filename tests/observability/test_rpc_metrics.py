"""rpc.server.duration: recorded by ServiceHost for unary and streaming calls, with the final status."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from agentmesh.config import Settings
from agentmesh.errors import InvalidArgument, NotFound
from agentmesh.rpc.client import open_channel
from agentmesh.rpc.errors import translate_errors
from agentmesh.rpc.server import ServiceHost
from agentmesh.telemetry.instruments import RPC_SERVER_DURATION
from agentmesh.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, sessions_pb2
from tests.observability.obs_helpers import memory_telemetry, metric_points
from tests.support.timing import polling


class FakeGateway(gateway_pb2_grpc.GatewayServicer):
    @translate_errors
    async def CreateSession(self, request, context):
        return sessions_pb2.Session(session_id=request.session_id or "s1")

    @translate_errors
    async def GetSession(self, request, context):
        raise NotFound(f"no session {request.session_id!r}")

    @translate_errors
    async def Chat(self, request, context):
        yield common_pb2.Event()
        if request.message == "fail":
            raise InvalidArgument("the message says fail")
        if request.message == "slow":
            await asyncio.sleep(30)
        yield common_pb2.Event()

    async def Cancel(self, request, context):  # no translate_errors: a bare crash
        raise RuntimeError("boom")


@pytest.fixture
async def served(tmp_path):
    telemetry, spans, reader = memory_telemetry("gateway")
    settings = Settings.from_env({"AGENTMESH_HOME": str(tmp_path)})
    host = ServiceHost("gateway", settings, telemetry, address="127.0.0.1:0")
    host.add(gateway_pb2_grpc.add_GatewayServicer_to_server, FakeGateway(), "agentmesh.v1.Gateway")
    await host.start()
    channel = open_channel(host.target)
    try:
        yield gateway_pb2_grpc.GatewayStub(channel), reader, spans, channel
    finally:
        await channel.close()
        await host.stop(grace=0)


def by_method(reader) -> dict[tuple[str, int], object]:
    return {
        (p.attributes["rpc.method"], p.attributes["rpc.grpc.status_code"]): p
        for p in metric_points(reader, RPC_SERVER_DURATION)
        if p.attributes["rpc.service"] == "agentmesh.v1.Gateway"
    }


async def recorded(reader, *keys: tuple[str, int], calls: int | None = None) -> dict[tuple[str, int], object]:
    """`by_method` once the server has recorded `keys` (and `calls` calls in all): it records a
    call after sending its status, so the caller may have its answer first."""
    async for _ in polling():
        points = by_method(reader)
        if all(k in points for k in keys) and (calls is None or sum(p.count for p in points.values()) >= calls):
            break
    return points


async def test_unary_calls_are_recorded_with_their_status(served):
    stub, reader, _, _ = served
    await stub.CreateSession(gateway_pb2.CreateSessionRequest(session_id="a"))
    await stub.CreateSession(gateway_pb2.CreateSessionRequest(session_id="b"))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.GetSession(sessions_pb2.GetSessionRequest(session_id="nope"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND

    points = await recorded(reader, ("CreateSession", grpc.StatusCode.OK.value[0]),
                            ("GetSession", grpc.StatusCode.NOT_FOUND.value[0]), calls=3)
    ok = points[("CreateSession", grpc.StatusCode.OK.value[0])]
    assert ok.count == 2
    assert ok.attributes["rpc.system"] == "grpc"
    assert ok.sum >= 0
    assert points[("GetSession", grpc.StatusCode.NOT_FOUND.value[0])].count == 1


async def test_streaming_calls_are_recorded_when_the_stream_ends(served):
    stub, reader, _, _ = served
    events = [e async for e in stub.Chat(gateway_pb2.ChatRequest(session_id="s", message="hi"))]
    assert len(events) == 2
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in stub.Chat(gateway_pb2.ChatRequest(session_id="s", message="fail")):
            pass
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    points = await recorded(reader, ("Chat", grpc.StatusCode.OK.value[0]), ("Chat", grpc.StatusCode.INVALID_ARGUMENT.value[0]))
    assert points[("Chat", grpc.StatusCode.OK.value[0])].count == 1
    assert points[("Chat", grpc.StatusCode.INVALID_ARGUMENT.value[0])].count == 1


async def test_an_unhandled_crash_counts_as_unknown(served):
    stub, reader, _, _ = served
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Cancel(gateway_pb2.CancelRequest(session_id="s"))
    assert err.value.code() == grpc.StatusCode.UNKNOWN
    points = await recorded(reader, ("Cancel", grpc.StatusCode.UNKNOWN.value[0]))
    assert points[("Cancel", grpc.StatusCode.UNKNOWN.value[0])].count == 1


async def test_server_spans_are_made_with_the_service_provider(served):
    stub, _, spans, _ = served
    await stub.CreateSession(gateway_pb2.CreateSessionRequest(session_id="a"))
    async for _ in polling():  # the server ends its span after sending the answer
        if "/agentmesh.v1.Gateway/CreateSession" in (names := [s.name for s in spans.get_finished_spans()]):
            break
    assert "/agentmesh.v1.Gateway/CreateSession" in names


async def test_health_probes_are_measured_but_not_traced(served):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    _, reader, spans, channel = served
    health = health_pb2_grpc.HealthStub(channel)
    reply = await health.Check(health_pb2.HealthCheckRequest(service=""))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    async for _ in polling():  # recorded after the answer is sent
        if probes := [p for p in metric_points(reader, RPC_SERVER_DURATION) if p.attributes["rpc.service"] == "grpc.health.v1.Health"]:
            break
    assert not [s for s in spans.get_finished_spans() if "grpc.health" in s.name]
    assert probes and probes[0].attributes["rpc.method"] == "Check"


async def test_a_stream_the_client_cancels_counts_as_cancelled(served):
    stub, reader, _, _ = served
    call = stub.Chat(gateway_pb2.ChatRequest(session_id="s", message="slow"))
    await call.read()  # the first event: the handler is now inside its slow step
    call.cancel()

    def cancelled():
        return by_method(reader).get(("Chat", grpc.StatusCode.CANCELLED.value[0]))

    async for _ in polling(0.025):  # the server sees the cancellation asynchronously
        if cancelled():
            break
    assert cancelled() is not None and cancelled().count == 1
