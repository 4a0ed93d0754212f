"""Calling a peer service: its failures as core exceptions that name the peer.

    reply = await peer_call("the memory service at 10.0.0.7:50054", stub.GetSession(request, timeout=30))

An outage (UNAVAILABLE, DEADLINE_EXCEEDED) becomes `Unavailable("the memory service at … is
not answering (…)")`, so the person reading the error learns which hop failed; any other
status becomes the matching `agentmesh.errors` exception carrying the peer's own sentence.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

import grpc

from agentmesh.errors import AgentmeshError, Unavailable
from agentmesh.rpc.errors import core_error_from_rpc

__all__ = ["OUTAGE", "peer_call", "peer_error", "rpc_detail"]

T = TypeVar("T")

# Statuses that mean the peer could not be reached or did not answer in time.
OUTAGE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def rpc_detail(err: grpc.aio.AioRpcError) -> str:
    """The peer's sentence, or the status name when it sent none."""
    return str(err.details() or err.code().name)


def peer_error(err: grpc.aio.AioRpcError, peer: str) -> AgentmeshError:
    """`err` from `peer` ("the tools service at host:port") as a core exception."""
    if err.code() in OUTAGE:
        return Unavailable(f"{peer} is not answering ({rpc_detail(err)})")
    return core_error_from_rpc(err)


async def peer_call(peer: str, call: Awaitable[T]) -> T:
    """Await one RPC to `peer`; a failure is raised as `peer_error` says."""
    try:
        return await call
    except grpc.aio.AioRpcError as err:
        raise peer_error(err, peer) from None
