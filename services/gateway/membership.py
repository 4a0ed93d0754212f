"""The gateway replicas this one knows, kept current, and which of them owns a session.

Plain asyncio, no gRPC. A fixed list never changes; a DNS name (a Kubernetes headless Service,
which lists only Ready pods) is resolved every `refresh_s`. A failed lookup keeps the last good
answer: a DNS hiccup must not make every replica believe it is alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from typing import Awaitable, Callable

from agentmesh.gateway.routing import PeerSpec, normalize_address, owner_of
from agentmesh.logs import get_logger

log = get_logger("agentmesh.gateway.membership")

Resolver = Callable[[str, int], Awaitable[list[str]]]

# Past peer lists remembered for hand-offs; more would only mean membership flapping.
MAX_PAST_VIEWS = 16


async def resolve_addresses(name: str, port: int) -> list[str]:
    """Every address `name` resolves to, as normalized `host:port`."""
    infos = await asyncio.get_running_loop().getaddrinfo(name, port, type=socket.SOCK_STREAM)
    return sorted({normalize_address(f"{info[4][0]}:{port}") for info in infos})


class Membership:
    def __init__(self, spec: PeerSpec, self_address: str, refresh_s: float = 5.0,
                 resolver: Resolver = resolve_addresses, handoff_window_s: float = 1800.0):
        self._spec = spec
        self.self_address = normalize_address(self_address)
        self._refresh_s = refresh_s
        self._resolver = resolver
        self._peers: tuple[str, ...] = spec.static
        # Peer lists replaced within the last `handoff_window_s` (the longest a turn may run),
        # newest last: a turn started under one of them may still run on its owner then.
        self._handoff_window_s = handoff_window_s
        self._past: list[tuple[float, tuple[str, ...]]] = []
        self._listeners: list[Callable[[tuple[str, ...]], None]] = []
        self._task: asyncio.Task | None = None
        self._warned_absent = False

    @property
    def peers(self) -> tuple[str, ...]:
        return self._peers

    def owner(self, session_id: str) -> str | None:
        """The replica that runs `session_id`'s turns; None while no peer is known."""
        return owner_of(session_id, self._peers)

    def owned_elsewhere(self, session_id: str) -> str | None:
        """The owner's address when it is another replica, else None (this one serves it)."""
        owner = self.owner(session_id)
        return owner if owner is not None and owner != self.self_address else None

    def previous_owners(self, session_id: str) -> list[str]:
        """Replicas that owned `session_id` under a recent, since replaced peer list (newest
        first), other than this one and the current owner: where a turn started before the
        change may still be running. Empty in steady state."""
        horizon = time.monotonic() - self._handoff_window_s
        self._past = [(at, view) for at, view in self._past if at > horizon]
        excluded = {self.self_address, self.owner(session_id)}
        owners: list[str] = []
        for _, view in reversed(self._past):
            owner = owner_of(session_id, view)
            if owner is not None and owner not in excluded and owner not in owners:
                owners.append(owner)
        return owners

    def on_change(self, listener: Callable[[tuple[str, ...]], None]) -> None:
        self._listeners.append(listener)

    async def start(self) -> None:
        self._check_self_listed()
        if self._spec.dns_name:
            await self.refresh()
            self._task = asyncio.create_task(self._refresh_forever(), name="gateway-peers")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def refresh(self) -> None:
        """Resolve the DNS name once; keep the last good answer on any failure."""
        try:
            async with asyncio.timeout(max(1.0, self._refresh_s)):
                answer = await self._resolver(self._spec.dns_name, self._spec.dns_port)
            resolved = tuple(sorted({normalize_address(address) for address in answer}))
        except (OSError, TimeoutError, ValueError) as exc:
            log.warning("gateway peer lookup failed; keeping the last answer",
                        name=self._spec.dns_name, error=str(exc) or type(exc).__name__, peers=list(self._peers))
            return
        if not resolved or resolved == self._peers:
            return
        joined, left = sorted(set(resolved) - set(self._peers)), sorted(set(self._peers) - set(resolved))
        if self._peers:
            self._past = [*self._past, (time.monotonic(), self._peers)][-MAX_PAST_VIEWS:]
        self._peers = resolved
        log.info("gateway peers changed", peers=list(resolved), joined=joined, left=left)
        self._check_self_listed()
        for listener in self._listeners:
            listener(resolved)

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_s)
            try:
                await self.refresh()
            except Exception:  # a bad answer must not stop the refreshing
                log.exception("gateway peer refresh failed")

    def _check_self_listed(self) -> None:
        # Normal for a moment while this pod is not Ready yet (a headless Service lists only
        # Ready pods); for good it means the advertised address does not match the list, and
        # every turn takes one hop more than it needs.
        absent = bool(self._peers) and self.self_address not in self._peers
        if absent and not self._warned_absent:
            log.warning("this gateway's advertised address is not among its peers",
                        advertise=self.self_address, peers=list(self._peers))
        self._warned_absent = absent
