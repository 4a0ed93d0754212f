"""What every service client has: its channel, its stub, the peer's name and a deadline."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, TypeVar

import grpc

__all__ = ["DEFAULT_TIMEOUT_S", "ServiceClient"]

DEFAULT_TIMEOUT_S = 30.0

T = TypeVar("T")


class ServiceClient:
    """Subclasses name their service and stub class; `stub` is built here and nowhere else.

    `target` is the peer's address as configured ("10.0.0.7:50054"); errors name the hop as
    "the memory service at 10.0.0.7:50054" (`peer`), so a person learns which one failed."""

    service: ClassVar[str] = ""

    def __init__(self, channel: grpc.aio.Channel, target: str = "", *, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.channel = channel
        self.target = target
        self.peer = f"the {self.service} service at {target}" if target else f"the {self.service} service"
        self.timeout_s = timeout_s
        self.stub: Any = self._make_stub(channel)

    def _make_stub(self, channel: grpc.aio.Channel) -> Any:
        raise NotImplementedError

    async def call(self, method: Callable[..., Awaitable[T]], request: Any, timeout: float | None = None) -> T:
        """`method` (one of `stub`'s) with `request` and the deadline; failures as core exceptions."""
        # Imported here: it brings the logging and tracing set-up, which a command line client
        # that only uses `stub` (and answers at once) should not load.
        from agentmesh.rpc.peers import peer_call

        return await peer_call(self.peer, method(request, timeout=timeout or self.timeout_s))
