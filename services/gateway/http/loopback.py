"""The gateway's own API, called over the loopback channel for the A2A and MCP endpoints.

Those endpoints run turns as the person who called them: each call here carries the caller's
`Authorization` header as gRPC metadata, so the gateway's interceptor checks it exactly as it
checks an HTTP/JSON or gRPC client's, and the turn runs for that principal.
"""

from __future__ import annotations

from typing import Any, AsyncIterator

import grpc

from agentmesh.error_reasons import default_reason
from agentmesh.errors import InvalidArgument
from agentmesh.rpc.errors import core_error_from_rpc
from agentmesh.v1 import agents_pb2, common_pb2, gateway_pb2, sessions_pb2

UNARY_TIMEOUT_S = 60.0


class CallerRefused(Exception):
    """The gateway refused the caller's credentials (gRPC UNAUTHENTICATED or PERMISSION_DENIED)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def caller_metadata(authorization: str | None) -> tuple[tuple[str, str], ...]:
    if authorization and authorization.isascii() and authorization.isprintable():
        return (("authorization", authorization),)
    return ()


def _error(err: grpc.aio.AioRpcError) -> Exception:
    code, text = err.code().name, err.details() or err.code().name
    if code in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
        return CallerRefused(code, text)
    failure = core_error_from_rpc(err)  # with the status's reason and metadata
    if failure.code != code:  # a code no core exception has (CANCELLED, ...) stays as the gateway said it
        failure.code, failure.reason = code, default_reason(code)
    return failure


class GatewayCalls:
    """Turns and sessions for a caller, through the gateway's gRPC server (a GatewayStub)."""

    def __init__(self, stub: Any):
        self._stub = stub

    async def check_caller(self, authorization: str | None) -> None:
        """Raises CallerRefused unless the gateway would take calls with these credentials; the
        cheapest call there is (the model list, answered by the gateway itself)."""
        try:
            await self._stub.ListModels(gateway_pb2.ListModelsRequest(), metadata=caller_metadata(authorization),
                                        timeout=UNARY_TIMEOUT_S)
        except grpc.aio.AioRpcError as err:
            raise _error(err) from None

    async def open_session(self, session_id: str, namespace: str, title: str, authorization: str | None,
                           labels: dict[str, str] | None = None) -> sessions_pb2.Session:
        """The session (created in `namespace` with `labels` when new). A session of another
        namespace is refused."""
        request = gateway_pb2.CreateSessionRequest(session_id=session_id, namespace=namespace, title=title,
                                                   labels=labels or {})
        try:
            session: sessions_pb2.Session = await self._stub.CreateSession(request, metadata=caller_metadata(authorization),
                                                     timeout=UNARY_TIMEOUT_S)
        except grpc.aio.AioRpcError as err:
            raise _error(err) from None
        if (session.namespace or "default") != namespace:
            raise InvalidArgument(f"session {session_id!r} belongs to namespace {session.namespace or 'default'!r}, "
                                  f"not {namespace!r}")
        return session

    async def chat(self, session_id: str, message: str, authorization: str | None,
                   options: gateway_pb2.ChatOptions | None = None) -> AsyncIterator[common_pb2.Event]:
        call = self._stub.Chat(gateway_pb2.ChatRequest(session_id=session_id, message=message, options=options),
                               metadata=caller_metadata(authorization))
        try:
            async for event in call:
                yield event
        except grpc.aio.AioRpcError as err:
            raise _error(err) from None
        finally:
            call.cancel()

    async def get_agent(self, namespace: str, ref: str, authorization: str | None) -> agents_pb2.AgentInfo:
        """A named agent (docs/agents.md) as the caller may see it; another tenant's is NOT_FOUND."""
        try:
            info: agents_pb2.AgentInfo = await self._stub.GetAgent(
                agents_pb2.GetAgentRequest(namespace=namespace, name=ref),
                metadata=caller_metadata(authorization), timeout=UNARY_TIMEOUT_S)
        except grpc.aio.AioRpcError as err:
            raise _error(err) from None
        return info

    async def list_agents(self, namespace: str, authorization: str | None) -> list[agents_pb2.AgentInfo]:
        try:
            reply = await self._stub.ListAgents(agents_pb2.ListAgentsRequest(namespace=namespace),
                                                metadata=caller_metadata(authorization), timeout=UNARY_TIMEOUT_S)
        except grpc.aio.AioRpcError as err:
            raise _error(err) from None
        return list(reply.agents)

    async def cancel(self, session_id: str, authorization: str | None) -> bool:
        try:
            reply = await self._stub.Cancel(gateway_pb2.CancelRequest(session_id=session_id),
                                            metadata=caller_metadata(authorization), timeout=UNARY_TIMEOUT_S)
        except grpc.aio.AioRpcError as err:
            raise _error(err) from None
        return bool(reply.cancelled)
