"""A signed channel that also records which calls it made, to tell a call carried on a stream
from a unary call of the same method (both have the same spans and statuses at the server)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc

from agentmesh.rpc.auth import SERVICE_TOKEN_HEADER
from agentmesh.rpc.identity import ServiceIdentity


class _Record:
    def __init__(self, identity: ServiceIdentity, audience: str, made: list[str]):
        self._identity = identity
        self._audience = audience
        self._made = made

    async def _start(self, continuation: Any, details: grpc.aio.ClientCallDetails, request: Any) -> Any:
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        self._made.append(method)
        metadata = grpc.aio.Metadata(*(tuple(details.metadata) if details.metadata else ()))
        metadata.add(SERVICE_TOKEN_HEADER, self._identity.token(self._audience))
        return await continuation(details._replace(metadata=metadata), request)


class _Unary(_Record, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await self._start(continuation, client_call_details, request)


class _Streams(_Record, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return await self._start(continuation, client_call_details, request_iterator)


def recording_channel(keys_dir: Path, caller: str, audience: str, target: str) -> tuple[grpc.aio.Channel, list[str]]:
    """A channel signed as `caller` for `audience`, and the list of the methods it called."""
    identity = ServiceIdentity.open(caller, keys_dir)
    made: list[str] = []
    channel = grpc.aio.insecure_channel(target, interceptors=[_Unary(identity, audience, made),
                                                              _Streams(identity, audience, made)])
    return channel, made
