"""Bearer-token authentication for the public API.

With no tokens configured (the local default) every call is let in. With tokens, each call
must carry `authorization: Bearer <token>`; health checks and reflection stay open so that
probes and tooling work.
"""

from __future__ import annotations

import hmac

import grpc

_OPEN_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, tokens: tuple[str, ...]):
        self._tokens = tuple(t.encode() for t in tokens)

    def _allowed(self, metadata) -> bool:
        for key, value in metadata or ():
            if key == "authorization":
                scheme, _, token = (value if isinstance(value, str) else value.decode()).partition(" ")
                if scheme.lower() == "bearer":
                    return any(hmac.compare_digest(token.encode(), t) for t in self._tokens)
        return False

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if not self._tokens or handler is None or handler_call_details.method.startswith(_OPEN_PREFIXES):
            return handler
        if self._allowed(handler_call_details.invocation_metadata):
            return handler
        return _deny(handler)


def _deny(handler):
    message = "missing or invalid credentials: send 'authorization: Bearer <token>' (AGENTMESH_AUTH_TOKEN for the CLI)"

    async def unary(request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def stream(request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # pragma: no cover - makes this an async generator

    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(unary, handler.request_deserializer, handler.response_serializer)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(stream, handler.request_deserializer, handler.response_serializer)
    return handler


def bearer_metadata(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()
