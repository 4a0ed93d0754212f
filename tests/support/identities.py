"""Channels that present a service's identity, for tests that stand in for a service's caller
(the tools tests play the agent; the memory tests play the agent or the gateway)."""

from __future__ import annotations

from pathlib import Path

import grpc

from agentmesh.rpc.client import open_channel
from agentmesh.rpc.identity import ServiceIdentity

# Who normally calls each service: the identity a test takes to reach it.
DEFAULT_CALLER = {"memory": "agent", "tools": "agent", "agent": "gateway", "gateway": "scheduler"}


def signed_channel(keys_dir: Path, caller: str, audience: str, target: str) -> grpc.aio.Channel:
    """A channel to `target` whose calls carry tokens `caller` signs for `audience`."""
    return open_channel(target, identity=ServiceIdentity.open(caller, keys_dir), audience=audience)


def caller_channel(keys_dir: Path, service: str, target: str) -> grpc.aio.Channel:
    """A channel to `service` at `target` as the service that normally calls it; for the
    gateway and the scheduler, whose callers are users, a plain channel."""
    if service in ("memory", "tools", "agent"):
        return signed_channel(keys_dir, DEFAULT_CALLER[service], service, target)
    return open_channel(target)
