"""gRPC method handlers, as the server's call interceptor (calls.py) sees them."""

from __future__ import annotations

from typing import Any, AsyncIterator, Callable

import grpc

from agentmesh.rpc.errors import abort_with

__all__ = ["behaviour_of", "refusal"]


def behaviour_of(handler: grpc.RpcMethodHandler) -> Callable[..., Any]:
    """The function that serves the method, whatever its kind (unary or streaming)."""
    behaviour: Callable[..., Any]
    if handler.request_streaming:
        behaviour = handler.stream_stream if handler.response_streaming else handler.stream_unary
    else:
        behaviour = handler.unary_stream if handler.response_streaming else handler.unary_unary
    return behaviour


def refusal(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str, method: str = "") -> grpc.RpcMethodHandler:
    """A handler that answers every call with `code` and `message` (and the code's generic
    reason, with the refused `method` in its metadata), without reading the request.

    Declared as a request stream whatever the method is: grpc.aio reads a unary request whole
    before the handler runs, so a refused caller could still make the server take in a message
    of the full receive size; a stream handler that never reads ends the call at once."""

    async def refuse(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> None:
        await abort_with(context, code, message, metadata={"method": method} if method else None)

    return grpc.stream_stream_rpc_method_handler(refuse, lambda raw: None, handler.response_serializer)
