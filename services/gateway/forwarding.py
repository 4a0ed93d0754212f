"""Forward a session's calls to the gateway replica that owns it, and relay its answer unchanged.

The wire half of session routing (membership.py and routing.py decide who owns a session). A
forwarded call carries this replica's service token (signed for the caller's principal), the
trace context (the channel is traced) and the deadline that is left, plus `x-agentmesh-routed: 1`:
the receiving replica always serves such a call from another gateway itself, so two replicas
that briefly disagree on membership cannot bounce a call between them. The owner's events, replies and errors (status code and message)
reach the caller as the owner sent them. An owner that cannot be reached before it answered
anything raises `OwnerUnreachable`, and the caller's replica serves the call itself.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from dataclasses import dataclass, field
from typing import AsyncGenerator

import grpc

from agentmesh import error_reasons
from agentmesh.clients.gateway import GatewayClient
from agentmesh.errors import Unavailable
from agentmesh.gateway.turns import SHUTDOWN_MESSAGE
from agentmesh.logs import get_logger
from agentmesh.rpc.auth import current_principal
from agentmesh.rpc.client import open_channel
from agentmesh.rpc.errors import STATUS_DETAILS_KEY
from agentmesh.rpc.identity import ServiceIdentity
from agentmesh.telemetry import Telemetry
from agentmesh.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

log = get_logger("agentmesh.gateway.forwarding")

ROUTED_HEADER = "x-agentmesh-routed"


class OwnerUnreachable(Exception):
    """The owning replica did not answer; the call has had no effect there."""


def was_routed(context: grpc.aio.ServicerContext) -> bool:
    # Only another replica may say so: a user setting the header cannot pin a session here.
    principal = current_principal.get()
    if principal is None or principal.via != "gateway":
        return False
    return any(key == ROUTED_HEADER for key, _ in context.invocation_metadata() or ())


@dataclass(eq=False)  # kept in a set, by identity
class _Relay:
    """A forwarded turn in flight, so a drain can end it with a reason like a local one."""

    interrupted: asyncio.Event = field(default_factory=asyncio.Event)
    last: common_pb2.Event | None = None


class Forwarder:
    def __init__(self, telemetry: Telemetry, connect_timeout_s: float, identity: ServiceIdentity):
        self._telemetry = telemetry
        self._identity = identity
        self._connect_timeout_s = connect_timeout_s
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._relays: set[_Relay] = set()
        self._streams: collections.Counter[str] = collections.Counter()  # relayed turns per owner
        self._peers: set[str] | None = None  # the current peer list, once it changed
        self._closing: set[asyncio.Task] = set()

    # --- calls ----------------------------------------------------------------------------

    async def chat(self, owner: str, request, context: grpc.aio.ServicerContext,
                   method: str = "Chat") -> AsyncGenerator[common_pb2.Event, None]:
        """The owner's Chat stream (or another stream of a turn's events: AttachTurn), event for
        event. OwnerUnreachable before the first event."""
        stub = await self._stub(owner)
        call = getattr(stub, method)(request, metadata=self._metadata(context), timeout=context.time_remaining())
        relay = _Relay()
        self._relays.add(relay)
        self._streams[owner] += 1
        interrupted = asyncio.ensure_future(relay.interrupted.wait())
        try:
            while True:
                read = asyncio.ensure_future(call.read())
                done, _ = await asyncio.wait({read, interrupted}, return_when=asyncio.FIRST_COMPLETED)
                if read not in done:
                    read.cancel()
                    yield self._shutdown_event(relay)
                    return
                event = read.result()
                if event is grpc.aio.EOF:
                    return
                relay.last = event
                yield event
        except grpc.aio.AioRpcError as err:
            if relay.last is None:
                if err.code() == grpc.StatusCode.UNAVAILABLE:
                    raise OwnerUnreachable(f"{owner}: {err.details() or err.code().name}") from None
                await context.abort(err.code(), err.details() or "", _status_trailers(err))
            assert relay.last is not None  # context.abort() above raises
            # Once a stream has started, failures arrive as an error event (docs/api.md); the
            # owner sends its own that way, so this is the hop itself failing.
            log.warning("owning gateway stopped answering mid-turn", owner=owner,
                        session_id=relay.last.session_id, code=err.code().name)
            yield self._event_after(relay.last, error=common_pb2.RunError(
                code=err.code().name, reason=error_reasons.default_reason(err.code().name),
                message=f"the gateway replica running this turn stopped answering ({err.details() or err.code().name}); "
                "the steps completed so far are saved — send the message again to continue",
            ))
        finally:
            interrupted.cancel()
            self._relays.discard(relay)
            call.cancel()
            self._streams[owner] -= 1
            self._close_if_departed(owner)

    async def watch(self, peer: str, request, context: grpc.aio.ServicerContext) -> AsyncGenerator[gateway_pb2.Activity, None]:
        """`peer`'s own activity (the routed marker keeps it from fanning out again). A peer that
        cannot be reached or stops answering ends its part quietly: the view shows the rest."""
        try:
            stub = await self._stub(peer)
            async for activity in stub.WatchActivity(request, metadata=self._metadata(context)):
                yield activity
        except (OwnerUnreachable, grpc.aio.AioRpcError) as exc:
            log.info("a gateway replica's activity is not available", peer=peer,
                     error=str(exc) if isinstance(exc, OwnerUnreachable) else exc.code().name)

    async def unary(self, owner: str, method: str, request, context: grpc.aio.ServicerContext):
        """The owner's reply to `method` (e.g. "Cancel"); its error, relayed, if it refused."""
        stub = await self._stub(owner)
        try:
            return await getattr(stub, method)(request, metadata=self._metadata(context), timeout=context.time_remaining())
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.UNAVAILABLE:
                raise OwnerUnreachable(f"{owner}: {err.details() or err.code().name}") from None
            await context.abort(err.code(), err.details() or "", _status_trailers(err))

    async def runs_turn(self, peer: str, session_id: str, context: grpc.aio.ServicerContext) -> bool:
        """Whether `peer` runs a turn of `session_id` now (its ListApprovals names a run). A
        peer that does not answer promptly runs nothing anyone can reach."""
        try:
            stub = await self._stub(peer)
            reply = await stub.ListApprovals(
                gateway_pb2.ListApprovalsRequest(session_id=session_id),
                metadata=self._metadata(context), timeout=self._connect_timeout_s,
            )
        except (OwnerUnreachable, grpc.aio.AioRpcError) as exc:
            log.info("previous owner did not answer; assuming no turn there", peer=peer, session_id=session_id,
                     error=str(exc) if isinstance(exc, OwnerUnreachable) else exc.code().name)
            return False
        return bool(reply.run_id)

    # --- channels and life cycle ----------------------------------------------------------

    async def _stub(self, owner: str) -> gateway_pb2_grpc.GatewayStub:
        channel = self._channels.get(owner)
        if channel is None:
            channel = self._channels[owner] = open_channel(owner, self._telemetry, identity=self._identity, audience="gateway")
        try:
            await asyncio.wait_for(self._ready(channel), self._connect_timeout_s)
        except TimeoutError:
            # A replica that vanished with its address black-holed costs this long, not the
            # caller's whole deadline.
            raise OwnerUnreachable(f"{owner}: not reachable within {self._connect_timeout_s:g}s") from None
        return GatewayClient(channel, owner).stub

    @staticmethod
    async def _ready(channel: grpc.aio.Channel) -> None:
        """Connected, or OwnerUnreachable as soon as a connection attempt failed (a refused
        connection is a replica that is gone: no point waiting for the reconnect backoff)."""
        state = channel.get_state(try_to_connect=True)
        while state != grpc.ChannelConnectivity.READY:
            if state in (grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.SHUTDOWN):
                raise OwnerUnreachable(f"connection failed ({state.name})")
            await channel.wait_for_state_change(state)
            state = channel.get_state(try_to_connect=True)

    @staticmethod
    def _metadata(context: grpc.aio.ServicerContext) -> tuple[tuple[str, str], ...]:
        # The caller's own credentials stay here: the channel signs for the caller's principal.
        return ((ROUTED_HEADER, "1"),)

    def retain(self, peers: tuple[str, ...]) -> None:
        """Close the channels of replicas that left (pods come and go with new addresses) -
        but not under a turn still streaming from one: a replica that drains finishes it."""
        self._peers = set(peers)
        for owner in list(self._channels):
            self._close_if_departed(owner)

    def _close_if_departed(self, owner: str) -> None:
        if self._peers is None or owner in self._peers or self._streams[owner] > 0 or owner not in self._channels:
            return
        del self._streams[owner]
        task = asyncio.get_running_loop().create_task(self._channels.pop(owner).close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def drain(self, grace_s: float) -> None:
        """Like the core's drain for local turns: let forwarded turns finish, and shortly before
        the grace period ends tell the ones still streaming why they stop."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, grace_s - min(1.0, grace_s * 0.2))
        while self._relays and loop.time() < deadline:  # noqa: ASYNC110 - relays end on many paths; a 50 ms poll bounds the drain
            await asyncio.sleep(0.05)
        for relay in list(self._relays):
            relay.interrupted.set()

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            with contextlib.suppress(Exception):
                await channel.close()
        await asyncio.gather(*self._closing, return_exceptions=True)

    @classmethod
    def _shutdown_event(cls, relay: _Relay) -> common_pb2.Event:
        if relay.last is None:
            raise Unavailable("the gateway is shutting down; retry in a moment", reason=error_reasons.SHUTTING_DOWN)
        log.info("forwarded turn interrupted by shutdown", session_id=relay.last.session_id, run_id=relay.last.run_id)
        return cls._event_after(relay.last, error=common_pb2.RunError(code="UNAVAILABLE", message=SHUTDOWN_MESSAGE,
                                                                     reason=error_reasons.SHUTTING_DOWN))

    @staticmethod
    def _event_after(last: common_pb2.Event, **payload) -> common_pb2.Event:
        return common_pb2.Event(session_id=last.session_id, run_id=last.run_id, seq=last.seq + 1,
                                timestamp=time.time(), **payload)


def _status_trailers(err: grpc.aio.AioRpcError) -> tuple[tuple[str, bytes], ...]:
    """The owner's status details (its ErrorInfo), to relay with its code and sentence."""
    return tuple((key, value) for key, value in err.trailing_metadata() or () if key == STATUS_DETAILS_KEY)


class SessionRouter:
    """Decides, per call, whether this replica serves a session or which replica does."""

    def __init__(self, membership, forwarder: Forwarder, runs_turn_here):
        self.membership = membership
        self.forwarder = forwarder
        self._runs_turn_here = runs_turn_here

    async def target(self, session_id: str, context: grpc.aio.ServicerContext) -> str | None:
        """The replica to forward to, or None to serve here.

        Here: a session whose turn runs here (a replica finishing its last turn while the others
        already route past it still answers for that turn). Otherwise the owner, unless the call
        was forwarded already: a marked call is never forwarded again, so replicas that briefly
        disagree on membership cannot bounce it. Where this replica serves, a replica that owned
        the session before the last membership changes and still runs its turn takes the call
        (a hand-off: the new owner must not start a second turn beside it).
        """
        if self._runs_turn_here(session_id):
            return None
        if not was_routed(context):
            owner = self.membership.owned_elsewhere(session_id)
            if owner is not None:
                return owner
        for previous in self.membership.previous_owners(session_id):
            if await self.forwarder.runs_turn(previous, session_id, context):
                return previous
        return None
