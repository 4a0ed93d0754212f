"""Rebuild a gRPC method handler around its behaviour, keeping its kind (unary or streaming,
coroutine or async generator) — what the server interceptors in this package share."""

from __future__ import annotations

import inspect
from typing import Any, AsyncIterator, Awaitable, Callable

import grpc

__all__ = ["Prelude", "rebuild", "refusal"]

# Runs before the behaviour with (request or None for a request stream, context); may abort.
Prelude = Callable[[Any, grpc.aio.ServicerContext], Awaitable[None]]


def _behaviour(handler: grpc.RpcMethodHandler) -> Callable[..., Any]:
    behaviour: Callable[..., Any]
    if handler.request_streaming:
        behaviour = handler.stream_stream if handler.response_streaming else handler.stream_unary
    else:
        behaviour = handler.unary_stream if handler.response_streaming else handler.unary_unary
    return behaviour


def rebuild(
    handler: grpc.RpcMethodHandler,
    prelude: Prelude,
    *,
    request_deserializer: Callable[[bytes], Any] | None = None,
    requests: Callable[[AsyncIterator[Any], grpc.aio.ServicerContext], AsyncIterator[Any]] | None = None,
) -> grpc.RpcMethodHandler:
    """The same method, with `prelude` awaited first; `requests` may wrap a request stream."""
    inner = _behaviour(handler)

    def arguments(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if handler.request_streaming and requests is not None:
            request = requests(request, context)
        return request

    if inspect.isasyncgenfunction(inner):

        async def stream_behaviour(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            await prelude(None if handler.request_streaming else request, context)
            async for item in inner(arguments(request, context), context):
                yield item

        behaviour: Callable[..., Any] = stream_behaviour
    else:

        async def call_behaviour(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await prelude(None if handler.request_streaming else request, context)
            return await inner(arguments(request, context), context)

        behaviour = call_behaviour

    deserializer = request_deserializer or handler.request_deserializer
    serializer = handler.response_serializer
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(behaviour, deserializer, serializer)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(behaviour, deserializer, serializer)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(behaviour, deserializer, serializer)
    return grpc.unary_unary_rpc_method_handler(behaviour, deserializer, serializer)


def refusal(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """A handler that answers every call with `code` and `message`, without reading the request.

    Declared as a request stream whatever the method is: grpc.aio reads a unary request whole
    before the handler runs, so a refused caller could still make the server take in a message
    of the full receive size; a stream handler that never reads ends the call at once."""

    async def refuse(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, message)

    return grpc.stream_stream_rpc_method_handler(refuse, lambda raw: None, handler.response_serializer)
