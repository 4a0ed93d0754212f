"""gRPC method handlers, as the server's call interceptor (calls.py) sees them."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Callable

import grpc

from agentmesh.rpc.errors import abort_with

__all__ = ["REFUSAL_DRAIN_S", "REFUSAL_IDLE_S", "behaviour_of", "refusal"]

# A refused request stream is answered once its client stops sending: when it half-closes, has
# sent nothing for REFUSAL_IDLE_S (it waits for an answer), or after REFUSAL_DRAIN_S at most.
# A second, not less: on a busy machine a client still writing can pause for a few tenths of one,
# and answering then resets the stream under its next message (INTERNAL, not the refusal).
REFUSAL_IDLE_S = 1.0
REFUSAL_DRAIN_S = 5.0


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
    reason, with the refused `method` in its metadata), without decoding the request.

    Declared as a request stream whatever the method is: grpc.aio reads a unary request whole
    before the handler runs, so a refused caller could still make the server take in a message
    of the full receive size; a stream handler that never reads ends the call at once.

    A method whose requests are a stream is the exception: ending the call while the client
    still has messages on the way resets the HTTP/2 stream under them, and the client's gRPC
    then reports INTERNAL ("Internal error from Core") instead of the refusal — most of the
    time, depending on the race. So its messages are taken in and dropped (never decoded) until
    the client stops sending, within bounds (above), and then the refusal is sent."""
    streaming = handler.request_streaming

    async def refuse(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> None:
        if streaming:
            await _drain(requests)
        await abort_with(context, code, message, metadata={"method": method} if method else None)

    return grpc.stream_stream_rpc_method_handler(refuse, lambda raw: None, handler.response_serializer)


async def _drain(requests: AsyncIterator[Any]) -> None:
    """Read and drop a refused stream's messages until the client half-closes or goes quiet."""
    iterator = aiter(requests)
    try:
        async with asyncio.timeout(REFUSAL_DRAIN_S):
            while True:
                async with asyncio.timeout(REFUSAL_IDLE_S):
                    await anext(iterator)
    except (StopAsyncIteration, TimeoutError):
        return
