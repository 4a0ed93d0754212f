"""A grpc.aio server interceptor recording `rpc.server.duration` for every call.

Attributes follow the OpenTelemetry RPC conventions: `rpc.system`, `rpc.service`,
`rpc.method` and `rpc.grpc.status_code` (the numeric code). Unary and streaming handlers
are both wrapped; a streaming call is measured until its last message or its end.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any, AsyncIterator, Awaitable, Callable

import grpc

from agentmesh.telemetry.instruments import ServiceMetrics

__all__ = ["RpcMetricsInterceptor"]


def _split_method(full_method: str) -> tuple[str, str]:
    """"/agentmesh.v1.Gateway/Chat" -> ("agentmesh.v1.Gateway", "Chat")."""
    service, _, method = full_method.lstrip("/").rpartition("/")
    return service or "unknown", method or full_method


def _final_code(context: grpc.aio.ServicerContext, error: BaseException | None) -> grpc.StatusCode:
    try:
        code = context.code()
    except Exception:  # noqa: BLE001 - an older context without code(): fall back on the error
        code = None
    if isinstance(code, int):  # the core reports the numeric value
        code = next((c for c in grpc.StatusCode if c.value[0] == code), None)
    if code is not None and code != grpc.StatusCode.OK:
        return code
    if error is None:
        return grpc.StatusCode.OK
    if isinstance(error, (asyncio.CancelledError, GeneratorExit)):
        return grpc.StatusCode.CANCELLED
    # An exception the handler did not turn into a status: gRPC answers UNKNOWN.
    return grpc.StatusCode.UNKNOWN


class RpcMetricsInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc ships no types
    def __init__(self, metrics: ServiceMetrics):
        self._metrics = metrics

    def _record(self, attributes: dict[str, Any], started: float, context: Any, error: BaseException | None) -> None:
        code = _final_code(context, error)
        self._metrics.rpc_server_duration.record(
            (time.perf_counter() - started) * 1000.0, {**attributes, "rpc.grpc.status_code": code.value[0]}
        )

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        service, method = _split_method(handler_call_details.method)
        attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}

        if handler.response_streaming:
            behavior = handler.unary_stream or handler.stream_stream
            wrapped: Callable[[Any, Any], Any] = self._wrap_streaming(behavior, attributes)
            factory = grpc.unary_stream_rpc_method_handler if handler.unary_stream else grpc.stream_stream_rpc_method_handler
        else:
            behavior = handler.unary_unary or handler.stream_unary
            wrapped = self._wrap_unary(behavior, attributes)
            factory = grpc.unary_unary_rpc_method_handler if handler.unary_unary else grpc.stream_unary_rpc_method_handler
        return factory(
            wrapped,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _wrap_unary(self, behavior: Any, attributes: dict[str, Any]) -> Callable[[Any, Any], Awaitable[Any]]:
        async def unary(request_or_iterator: Any, context: Any) -> Any:
            started = time.perf_counter()
            error: BaseException | None = None
            try:
                result = behavior(request_or_iterator, context)
                if inspect.isawaitable(result):
                    result = await result
                return result
            except BaseException as exc:
                error = exc
                raise
            finally:
                self._record(attributes, started, context, error)

        return unary

    def _wrap_streaming(self, behavior: Any, attributes: dict[str, Any]) -> Callable[[Any, Any], AsyncIterator[Any]]:
        async def streaming(request_or_iterator: Any, context: Any) -> AsyncIterator[Any]:
            started = time.perf_counter()
            error: BaseException | None = None
            try:
                result = behavior(request_or_iterator, context)
                if inspect.isasyncgen(result) or hasattr(result, "__aiter__"):
                    async for response in result:
                        yield response
                elif inspect.isawaitable(result):
                    # A handler that writes with context.write() and returns nothing.
                    await result
            except BaseException as exc:
                error = exc
                raise
            finally:
                self._record(attributes, started, context, error)

        return streaming
