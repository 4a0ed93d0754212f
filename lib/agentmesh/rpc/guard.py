"""Requests that are not protobuf at all: answered INVALID_ARGUMENT, never a traceback.

grpc.aio decodes the request before the servicer runs; a decoder that raises is logged as an
"Unexpected error" with its traceback and answered UNKNOWN. Here the decoder's failure becomes
a marker, and the method answers INVALID_ARGUMENT with the message type it expected.
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Callable

import grpc

from agentmesh.rpc.handlers import rebuild

__all__ = ["MALFORMED", "MalformedRequestInterceptor"]


class _Malformed:
    __slots__ = ()


MALFORMED = _Malformed()


def _type_name(deserializer: Callable[[bytes], Any] | None) -> str:
    owner = getattr(deserializer, "__self__", None)
    descriptor = getattr(owner, "DESCRIPTOR", None)
    return getattr(descriptor, "full_name", "") or "protobuf"


def _lenient(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any]:
    def decode(raw: bytes) -> Any:
        if deserializer is None:
            return raw
        try:
            return deserializer(raw)
        except Exception:  # noqa: BLE001 - any decoding failure is the caller's bad bytes
            return MALFORMED

    return decode


class MalformedRequestInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc ships no types
    async def intercept_service(self, continuation: Any, handler_call_details: Any) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        message = (f"the request is not a valid {_type_name(handler.request_deserializer)} message "
                   f"(the bytes do not decode as protobuf)")

        async def check(request: Any, context: grpc.aio.ServicerContext) -> None:
            if request is MALFORMED:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)

        async def checked(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async for request in requests:
                await check(request, context)
                yield request

        return rebuild(handler, check, request_deserializer=_lenient(handler.request_deserializer), requests=checked)
