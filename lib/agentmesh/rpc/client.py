"""Channels to peer services, traced so that W3C context crosses every hop.

A restarted peer is used again within about a second: reconnect backoff is bounded (gRPC's
default grows to 120 s, so a peer that was down for a few seconds stayed unused for 13–18 s
after it came back), and a call made while the channel is (re)connecting waits for the peer
— up to `wait_for_peer_s` and never past the call's own deadline — instead of failing at once.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import grpc
from opentelemetry.instrumentation.grpc import aio_client_interceptors

from agentmesh.rpc.auth import signed_details
from agentmesh.rpc.identity import ServiceIdentity
from agentmesh.rpc.server import MAX_MESSAGE_BYTES
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


class _PeerWait:
    """Wait-for-ready, bounded: while the channel is not READY, hold a call until it is, for at
    most `wait_s` and within the call's deadline; then start it (failing fast if the peer is still
    away). gRPC's own `wait_for_ready` would hold a call for its whole deadline — 15 minutes for a
    tool call — when a peer is gone for good.

    With `identity` it also signs the call (one interceptor doing both: each aio interceptor
    is a coroutine and a call object more on every call). The token may be signed before the
    wait: a reused token has at least half its 60 s lifetime left, the wait is at most 10 s."""

    def __init__(self, wait_s: float, identity: ServiceIdentity | None = None, audience: str = ""):
        self.wait_s = wait_s
        self.identity = identity
        self.audience = audience
        self.channel: grpc.aio.Channel | None = None  # set right after the channel is made

    async def ready(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        if self.identity is not None:
            details = signed_details(self.identity, self.audience, details)
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


# One interceptor per call kind: a channel files each interceptor under the first kind it is an
# instance of. Each returns the call unawaited, so cancelling it still reaches the server.
class _WaitUnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]  # grpc ships no types
    def __init__(self, wait: _PeerWait):
        self._wait = wait

    async def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await continuation(await self._wait.ready(client_call_details), request)


class _WaitUnaryStream(grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]  # grpc ships no types
    def __init__(self, wait: _PeerWait):
        self._wait = wait

    async def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await continuation(await self._wait.ready(client_call_details), request)


class _WaitStreamUnary(grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[misc]  # grpc ships no types
    def __init__(self, wait: _PeerWait):
        self._wait = wait

    async def intercept_stream_unary(self, continuation: Any, client_call_details: Any, request_iterator: Any) -> Any:
        return await continuation(await self._wait.ready(client_call_details), request_iterator)


class _WaitStreamStream(grpc.aio.StreamStreamClientInterceptor):  # type: ignore[misc]  # grpc ships no types
    def __init__(self, wait: _PeerWait):
        self._wait = wait

    async def intercept_stream_stream(self, continuation: Any, client_call_details: Any, request_iterator: Any) -> Any:
        return await continuation(await self._wait.ready(client_call_details), request_iterator)


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
    waiting = _PeerWait(wait_for_peer_s, identity, audience)
    # Waiting (and signing) first; the tracing interceptor then adds the trace context.
    interceptors: list[Any] = []
    if wait_for_peer_s > 0 or identity is not None:
        interceptors += [kind(waiting) for kind in (_WaitUnaryUnary, _WaitUnaryStream, _WaitStreamUnary, _WaitStreamStream)]
    if telemetry:
        interceptors += aio_client_interceptors(tracer_provider=telemetry.tracer_provider)  # type: ignore[no-untyped-call]  # untyped library
    channel = grpc.aio.insecure_channel(target, options=_CHANNEL_OPTIONS, interceptors=interceptors)
    waiting.channel = channel
    return channel
