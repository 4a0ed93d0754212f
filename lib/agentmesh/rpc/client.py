"""Channels to peer services, signed and traced so that the principal and W3C context cross
every hop.

A restarted peer is used again within about a second: reconnect backoff is bounded (gRPC's
default grows to 120 s, so a peer that was down for a few seconds stayed unused for 13–18 s
after it came back), and a call made while the channel is (re)connecting waits for the peer
— up to `wait_for_peer_s` and never past the call's own deadline — instead of failing at once.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any

import grpc

from agentmesh.rpc.limits import MAX_MESSAGE_BYTES

if TYPE_CHECKING:
    from opentelemetry import trace

    from agentmesh.rpc.identity import ServiceIdentity
    from agentmesh.telemetry import Telemetry

__all__ = ["WAIT_FOR_PEER_S", "open_channel"]

# Transparent retries for calls that never reached a handler (peer restarting, connection reset).
_SERVICE_CONFIG = json.dumps(
    {
        # With a headless Service (dns:///name:port) calls spread over every replica.
        "loadBalancingConfig": [{"round_robin": {}}],
        "methodConfig": [
            {
                "name": [{}],
                "retryPolicy": {
                    "maxAttempts": 4,
                    "initialBackoff": "0.1s",
                    "maxBackoff": "2s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)

# Reconnect attempts to a peer that is down: the first after 0.1 s, then never more than 0.25 s
# apart (one refused TCP connect each time — nothing on loopback or in a cluster), so a peer
# that is back is found within a third of a second (with gRPC's ±20 % jitter). Each attempt
# may take 1 s to connect.
_RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 1000),
]

_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.enable_retries", 1),
    ("grpc.service_config", _SERVICE_CONFIG),
    *_RECONNECT_OPTIONS,
]

# How long a call waits for a peer that is (re)starting before it fails with UNAVAILABLE: long
# enough for a service to restart, short enough that an outage surfaces as an error, not a hang.
WAIT_FOR_PEER_S = 10.0


class _Calls:
    """What every call on a channel does before it starts, in one interceptor (each grpc.aio
    interceptor is a task and a call object more on every call):

    - signs it, with `identity`, for `audience` on behalf of the current principal (identity.py
      reuses a token while it has half its 60 s lifetime left; the wait below is at most 10 s);
    - waits for the peer, bounded: while the channel is not READY, holds the call until it is,
      for at most `wait_s` and within the call's deadline; then starts it (failing fast if the
      peer is still away). gRPC's own `wait_for_ready` would hold a call for its whole deadline
      — 15 minutes for a tool call — when a peer is gone for good;
    - with a `tracer`, opens the call's CLIENT span and puts its trace context into the call's
      metadata (telemetry/rpcspans.py); the span ends when the call does.

    The call is returned unawaited, so cancelling it still reaches the server."""

    def __init__(self, wait_s: float, identity: ServiceIdentity | None = None, audience: str = "",
                 tracer: trace.Tracer | None = None):
        self.wait_s = wait_s
        self.identity = identity
        self.audience = audience
        self.tracer = tracer
        # Signing and spans bring JWT and OpenTelemetry: imported by the channels that use them,
        # so a plain channel (the command line's) costs gRPC alone.
        if identity is not None or tracer is not None:
            from agentmesh.rpc import auth
            from agentmesh.telemetry import rpcspans

            self._auth, self._spans = auth, rpcspans
        self.channel: grpc.aio.Channel | None = None  # set right after the channel is made
        self._attributes: dict[str, dict[str, object]] = {}  # per method, made once

    async def ready(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        channel = self.channel
        if self.wait_s <= 0 or channel is None or channel.get_state(try_to_connect=True) == grpc.ChannelConnectivity.READY:
            return details
        budget = self.wait_s if details.timeout is None else min(self.wait_s, details.timeout)
        started = time.monotonic()
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow the call being
            # cancelled when the channel turns ready at that moment, and the call would go ahead.
            async with asyncio.timeout(budget):
                await channel.channel_ready()
        except TimeoutError:
            pass  # the call itself fails with the transport's reason
        if details.timeout is None:
            return details
        remaining = max(0.001, details.timeout - (time.monotonic() - started))
        return details._replace(timeout=remaining)

    async def start(self, continuation: Any, details: grpc.aio.ClientCallDetails, request: Any) -> Any:
        if self.identity is None and self.tracer is None:
            return await continuation(await self.ready(details), request)
        metadata = grpc.aio.Metadata(*(tuple(details.metadata) if details.metadata else ()))
        if self.identity is not None:
            metadata.add(self._auth.SERVICE_TOKEN_HEADER, self.identity.token(self.audience, self._auth.current_principal.get()))
        details = await self.ready(details)
        span = None
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        if self.tracer is not None and method not in self._spans.LONG_LIVED_STREAMS:
            attributes = self._attributes.get(method)
            if attributes is None:
                attributes = self._attributes[method] = self._spans.rpc_attributes(method)
            span = self._spans.start_client_span(self.tracer, method, attributes, metadata)
        details = grpc.aio.ClientCallDetails(details.method, details.timeout, metadata, details.credentials,
                                             details.wait_for_ready)
        try:
            call = await continuation(details, request)
        except BaseException as exc:
            if span is not None:
                self._spans.end_client_span(span, grpc.StatusCode.UNKNOWN, f"{type(exc).__name__}: {exc}")
            raise
        if span is not None:
            self._spans.end_when_done(span, call)
        return call


# One interceptor per call kind: a channel files each interceptor under the first kind it is an
# instance of.
class _UnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]  # grpc ships no types
    def __init__(self, calls: _Calls):
        self._calls = calls

    async def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await self._calls.start(continuation, client_call_details, request)


class _UnaryStream(grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]  # grpc ships no types
    def __init__(self, calls: _Calls):
        self._calls = calls

    async def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await self._calls.start(continuation, client_call_details, request)


class _StreamUnary(grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[misc]  # grpc ships no types
    def __init__(self, calls: _Calls):
        self._calls = calls

    async def intercept_stream_unary(self, continuation: Any, client_call_details: Any, request_iterator: Any) -> Any:
        return await self._calls.start(continuation, client_call_details, request_iterator)


class _StreamStream(grpc.aio.StreamStreamClientInterceptor):  # type: ignore[misc]  # grpc ships no types
    def __init__(self, calls: _Calls):
        self._calls = calls

    async def intercept_stream_stream(self, continuation: Any, client_call_details: Any, request_iterator: Any) -> Any:
        return await self._calls.start(continuation, client_call_details, request_iterator)


def open_channel(
    target: str,
    telemetry: Telemetry | None = None,
    *,
    identity: ServiceIdentity | None = None,
    audience: str = "",
    wait_for_peer_s: float = WAIT_FOR_PEER_S,
) -> grpc.aio.Channel:
    """A channel to `target`. With `identity`, every call on it carries a token that service
    signs for `audience` (the service at `target`), on behalf of the current principal.
    `wait_for_peer_s=0` fails calls at once while the peer is away."""
    if identity is not None and not audience:
        raise ValueError("a signed channel needs the audience: the name of the service it reaches")
    tracer = telemetry.tracer_provider.get_tracer("agentmesh.rpc") if telemetry else None
    calls = _Calls(wait_for_peer_s, identity, audience, tracer)
    interceptors: list[Any] = []
    if wait_for_peer_s > 0 or identity is not None or tracer is not None:
        interceptors = [kind(calls) for kind in (_UnaryUnary, _UnaryStream, _StreamUnary, _StreamStream)]
    channel = grpc.aio.insecure_channel(target, options=_CHANNEL_OPTIONS, interceptors=interceptors)
    calls.channel = channel
    return channel
