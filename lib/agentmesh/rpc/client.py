"""Channels to peer services, traced so that W3C context crosses every hop."""

from __future__ import annotations

import json

import grpc
from opentelemetry.instrumentation.grpc import aio_client_interceptors

from agentmesh.rpc.auth import signing_interceptors
from agentmesh.rpc.identity import ServiceIdentity
from agentmesh.rpc.server import MAX_MESSAGE_BYTES
from agentmesh.telemetry import Telemetry

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

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.enable_retries", 1),
    ("grpc.service_config", _SERVICE_CONFIG),
]


def open_channel(target: str, telemetry: Telemetry | None = None, *,
                 identity: ServiceIdentity | None = None, audience: str = "") -> grpc.aio.Channel:
    """A channel to `target`. With `identity`, every call on it carries a token that service
    signs for `audience` (the service at `target`), on behalf of the current principal."""
    interceptors = aio_client_interceptors(tracer_provider=telemetry.tracer_provider) if telemetry else []
    if identity is not None:
        if not audience:
            raise ValueError("a signed channel needs the audience: the name of the service it reaches")
        interceptors = [*interceptors, *signing_interceptors(identity, audience)]
    return grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS, interceptors=interceptors)
