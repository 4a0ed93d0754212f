"""The loop's tool ports over gRPC: the tools service's catalog, sandboxed execution (carried
on one stream per agent process, agentmesh.rpc.carried) and background commands. Protobuf
stops here; the core sees `types`."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import grpc

from agentmesh.agent.adapters.background_sessions import KnownBackground
from agentmesh.agent.adapters.tool_catalog import Listing
from agentmesh.agent.loop.ports import BackgroundCheck
from agentmesh.agent.types import BackgroundDone, ToolCall, ToolOutcome, ToolSpec
from agentmesh.clients.tools import EXECUTE_METHOD, ToolsClient
from agentmesh.errors import Unavailable
from agentmesh.internal.v1 import tools_service_pb2
from agentmesh.rpc.carried import NotCarried
from agentmesh.rpc.convert import tool_result_from_proto, tool_spec_from_proto
from agentmesh.rpc.peers import OUTAGE, rpc_detail
from agentmesh.telemetry.propagation import trace_metadata
from agentmesh.v1 import tools_pb2

__all__ = ["EXECUTE_METHOD", "GrpcBackgroundCommands", "GrpcToolRunner"]



_ERROR_KINDS = {
    grpc.StatusCode.INVALID_ARGUMENT: "invalid_arguments",
    grpc.StatusCode.NOT_FOUND: "not_found",
    grpc.StatusCode.PERMISSION_DENIED: "denied",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "resource_exhausted",
    grpc.StatusCode.FAILED_PRECONDITION: "failed_precondition",
}




class GrpcToolRunner:
    """Tools over a channel *without* the tracing client interceptor: that interceptor awaits
    the call's status inside its own task, so cancelling a call through it never reaches the
    server (opentelemetry-instrumentation-grpc 0.5x). Trace context is injected by hand instead;
    the execute_tool span is the parent of the tools service's spans.

    `carry` (the agent's identity and tracer): Execute calls ride one long-lived stream
    (`Tools.CarriedCalls`, agentmesh.rpc.carried), each with its own token, CLIENT span,
    deadline and cancellation — cancelling the awaiting task cancels the call at the tools
    service, which kills its sandboxed process; a request too large to carry goes as the unary call."""

    def __init__(self, client: ToolsClient, *, timeout_s: float, catalog_timeout_s: float = 10.0):
        self._client = client
        self._stub = client.stub
        self._target = client.target
        self._timeout_s = timeout_s
        self._catalog_timeout_s = catalog_timeout_s
        self._executes = client.executes

    @property
    def carrying_executes(self) -> bool:
        """Whether Execute calls ride the stream (False: a runner made without `carry`)."""
        return self._executes is not None

    async def close(self) -> None:
        """Close the carried calls' stream (the channel is the caller's to close)."""
        await self._client.close()

    async def list_tools(self, namespace: str = "", *, mcp_version: float | None = None) -> list[ToolSpec]:
        return (await self.listing(namespace, mcp_version)).specs

    async def listing(self, namespace: str = "", mcp_version: float | None = None) -> Listing:
        """The catalog with the version it was listed at (tool_catalog.py)."""
        try:
            reply = await self._stub.ListTools(
                tools_pb2.ListToolsRequest(namespace=namespace, mcp_servers_version=mcp_version),
                timeout=self._catalog_timeout_s, metadata=trace_metadata()
            )
        except grpc.aio.AioRpcError as err:
            raise Unavailable(f"the tools service at {self._target} did not list its tools ({rpc_detail(err)})") from None
        return Listing([tool_spec_from_proto(s) for s in reply.tools], reply.catalog_version)

    async def execute(self, session_id: str, call: ToolCall, namespace: str = "", *,
                      mcp_version: float | None = None, sandbox_template: str = "", isolation: str = "") -> ToolOutcome:
        request = tools_service_pb2.ExecuteRequest(session_id=session_id, call_id=call.call_id, name=call.name,
                                           arguments_json=call.arguments_json, namespace=namespace,
                                           mcp_servers_version=mcp_version, sandbox_template=sandbox_template,
                                           isolation=isolation)
        try:
            reply = await self._execute(request)
        except grpc.aio.AioRpcError as err:
            detail = rpc_detail(err)
            if err.code() in OUTAGE:
                return ToolOutcome.error(
                    call, "sandbox_unavailable", f"error: the tools service at {self._target} is not answering ({detail})"
                )
            return ToolOutcome.error(call, _ERROR_KINDS.get(err.code(), "tool_error"), f"error: {detail}")
        return replace(tool_result_from_proto(reply.result), call_id=call.call_id, name=call.name)

    async def _execute(self, request: tools_service_pb2.ExecuteRequest) -> tools_service_pb2.ExecuteResponse:
        if self._executes is not None:
            try:
                return await self._executes.call(request, self._timeout_s)
            except NotCarried:  # too large to carry
                pass
        rpc = self._stub.Execute(request, timeout=self._timeout_s, metadata=trace_metadata())
        try:
            return await rpc
        except asyncio.CancelledError:
            rpc.cancel()  # the tools service sees the cancellation and kills the sandboxed process
            raise


class GrpcBackgroundCommands:
    """BackgroundResults / StopBackground on the tools service; which sessions have any to
    collect, from `known` (BackgroundWatch; None: always ask)."""

    def __init__(self, client: ToolsClient, *, timeout_s: float = 10.0, known: KnownBackground | None = None):
        self._stub = client.stub
        self._target = client.target
        self._timeout_s = timeout_s
        self._known = known

    def may_have(self, session_id: str) -> bool:
        return self._known is None or self._known.may_have(session_id)

    async def take_finished(self, session_id: str) -> BackgroundCheck:
        try:
            reply = await self._stub.BackgroundResults(tools_service_pb2.BackgroundResultsRequest(session_id=session_id),
                                                       timeout=self._timeout_s, metadata=trace_metadata())
        except grpc.aio.AioRpcError as err:
            raise Unavailable(f"the tools service at {self._target} did not answer ({rpc_detail(err)})") from None
        return BackgroundCheck([BackgroundDone(id=c.id, command=c.command, status=c.status,
                                               result=tool_result_from_proto(c.result),
                                               seconds=max(c.finished_at - c.started_at, 0.0)) for c in reply.finished],
                               reply.running)

    async def stop(self, session_id: str) -> int:
        try:
            reply = await self._stub.StopBackground(tools_service_pb2.StopBackgroundRequest(session_id=session_id),
                                                    timeout=self._timeout_s, metadata=trace_metadata())
        except grpc.aio.AioRpcError as err:
            raise Unavailable(f"the tools service at {self._target} did not answer ({rpc_detail(err)})") from None
        return reply.stopped
