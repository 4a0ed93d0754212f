"""The turns this gateway runs: one at a time per session, and the relay of each one's events.

A session's next message meets the running turn by its if_busy policy (`SessionTurns.take`):
refused, queued behind it, or put in its place (interrupt, rollback). `relay` passes the
agent's events for a turn on to the client as they come, and lets a Cancel — or the gateway's
shutdown — cut in between any two of them.

Plain async Python, like `core.py`, which uses both.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from agentmesh import error_reasons
from agentmesh.errors import AgentmeshError, DeadlineExceeded, FailedPrecondition, error_of_code
from agentmesh.gateway.ports import AgentRunner
from agentmesh.internal.v1 import agent_service_pb2
from agentmesh.logs import get_logger
from agentmesh.v1 import common_pb2

__all__ = ["SHUTDOWN_MESSAGE", "RunningTurn", "SessionTurns", "relay"]

log = get_logger("agentmesh.gateway")

SHUTDOWN_MESSAGE = (
    "the gateway is shutting down and this turn was interrupted; the steps completed so far are "
    "saved — send the message again to continue"
)

_STOP_REASON_OF = {"interrupt": "interrupted", "rollback": "rolled_back"}

# How many of the agent's events the relay reads ahead of a slow client; past that the agent's
# stream waits (gRPC's flow control carries the wait back to the agent).
RELAY_BACKLOG = 256


@dataclass(eq=False)
class RunningTurn:
    run_id: str
    # Who sent the message (a member may decide only the approvals of their own runs).
    started_by: str = ""
    # The namespace of the session it runs in: where the turn meant to open it, then what the
    # agent's run_started said it is. Another message to the session is checked against it.
    namespace: str = ""
    # Set once the agent opened the session (its first event) or the turn ended: until then
    # the turn may be a stranger's that memory is about to refuse, so it is no sign of whose
    # the session is.
    opened: asyncio.Event = field(default_factory=asyncio.Event)
    cancel_requested: bool = False
    # Set when the turn is stopped because the gateway is going away, not by the user.
    interrupted: bool = False
    # Tool calls held for approval, as seen in the relayed events, in the order they came.
    pending_approvals: dict[str, common_pb2.ApprovalRequested] = field(default_factory=dict)
    # To the agent running the turn: approval decisions, an interrupt (None: the call is over).
    controls: asyncio.Queue[agent_service_pb2.RunTurnRequest | None] = field(default_factory=asyncio.Queue)
    # Set once the session no longer belongs to this turn.
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    # A newer message that interrupts (or rolls back) this turn takes the session straight from
    # it, before any message merely waiting in line; "interrupted" | "rolled_back".
    successor: "RunningTurn | None" = None
    superseded_as: str = ""
    # Set by the relay while it runs: how a cancel reaches it while it waits for the agent's next event.
    wake_relay: Callable[[], None] | None = None

    def cancel(self, interrupted: bool = False) -> None:
        """Stop relaying: the client's stream ends with run_finished "cancelled" (or, when the
        gateway shuts down, `interrupted`, with an UNAVAILABLE error saying so)."""
        self.cancel_requested = True
        self.interrupted = self.interrupted or interrupted
        if self.wake_relay is not None:
            self.wake_relay()

    def supersede(self, successor: "RunningTurn", stop_reason: str) -> None:
        self.successor, self.superseded_as = successor, stop_reason
        self.controls.put_nowait(agent_service_pb2.RunTurnRequest(interrupt=stop_reason))

    def track(self, kind: str | None, event: common_pb2.Event) -> None:
        """Know which calls wait for a decision before the client can see the request, so an
        Approve for anything else is answered NOT_FOUND here, without a trip to the agent."""
        if kind == "approval_request":
            self.pending_approvals[event.approval_request.call_id] = event.approval_request
        elif kind == "approval_resolved":
            self.pending_approvals.pop(event.approval_resolved.call_id, None)


class SessionTurns:
    """Which turn runs each session in this replica. With several replicas, the gRPC adapter
    sends each session's calls to the replica that owns it (routing.py), so this is enough."""

    def __init__(self) -> None:
        self._running: dict[str, RunningTurn] = {}

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._running

    def __bool__(self) -> bool:
        return bool(self._running)

    def get(self, session_id: str) -> RunningTurn | None:
        return self._running.get(session_id)

    def all(self) -> list[RunningTurn]:
        return list(self._running.values())

    async def take(self, session_id: str, turn: RunningTurn, policy: str,
                   authorize: Callable[[RunningTurn], None] | None = None,
                   waiting: Callable[[], None] | None = None) -> RunningTurn | None:
        """Make `turn` the session's running turn, by `policy` when another one runs: refuse,
        wait for it, or stop it and take over. The turn it superseded, if any.

        `authorize` sees the running turn (its session opened, so its namespace is the
        session's) before the policy touches it, and raises for a caller who may not use the
        session: a stranger cannot stop, queue behind or even learn of another tenant's turn.
        `waiting` is called when the turn waits in line (its run is then "queued")."""
        superseded: RunningTurn | None = None
        try:
            while True:
                running = self._running.get(session_id)
                if running is None:
                    self._running[session_id] = turn
                    return superseded
                if running is turn:  # handed over by the turn it superseded
                    return superseded
                if not running.opened.is_set():
                    # Opening: it may be a stranger's turn memory is about to refuse. Neither
                    # refuse nor stop anything on its account; look again once it is known.
                    await running.opened.wait()
                    continue
                if authorize is not None:
                    authorize(running)
                if policy == "reject":
                    raise FailedPrecondition(
                        f"session {session_id!r} is already running a turn; wait for it to finish, cancel it, "
                        "or send with if_busy enqueue, interrupt or rollback",
                        reason=error_reasons.SESSION_BUSY, metadata={"session_id": session_id},
                    )
                if policy in _STOP_REASON_OF and running.successor is None:
                    running.supersede(turn, _STOP_REASON_OF[policy])
                    superseded = running
                    log.info("turn superseded", session_id=session_id, run_id=running.run_id, by=policy)
                # Enqueued, or another message already took over: wait, then look again.
                if waiting is not None:
                    waiting()
                await running.ended.wait()
        except BaseException:
            if superseded is not None and superseded.successor is turn:
                superseded.successor = None
            raise

    def release(self, session_id: str, turn: RunningTurn) -> None:
        """The session stops belonging to `turn`: to the turn that superseded it, if any."""
        if self._running.get(session_id) is turn:
            if turn.successor is not None:
                self._running[session_id] = turn.successor
            else:
                del self._running[session_id]
        turn.opened.set()
        turn.ended.set()


_DONE = object()  # the agent's stream ended
_WAKE = object()  # a cancel, for a relay waiting on an empty queue


async def relay(agent: AgentRunner, run: agent_service_pb2.RunTurnRequest, turn: RunningTurn,
                timeout_s: float) -> AsyncIterator[common_pb2.Event]:
    """The agent's events for `run`, as they come, ending with the agent's last one, or with a
    cancel's run_finished, or an error event when the turn fails or outlives `timeout_s`.

    One task reads the agent's stream into a queue and the relay reads the queue, so a cancel
    has something to interrupt: `RunningTurn.cancel` puts a wake-up on the queue when the relay
    may be waiting on it (and when it is not, the relay looks at the flag before its next read).
    Nothing is started per event."""
    queue: asyncio.Queue[object] = asyncio.Queue(maxsize=RELAY_BACKLOG)

    async def pump() -> None:
        try:
            async with asyncio.timeout(timeout_s):
                async for event in agent.run_turn(run, turn.controls):
                    await queue.put(event)
        except TimeoutError:
            await queue.put(DeadlineExceeded(f"the turn ran longer than {timeout_s:.0f}s and was stopped",
                                             reason=error_reasons.TURN_TIMEOUT, metadata={"timeout_s": f"{timeout_s:g}"}))
        except AgentmeshError as exc:
            await queue.put(exc)
        await queue.put(_DONE)

    def wake() -> None:
        if queue.empty():  # otherwise the relay has items to read, and sees the flag after one
            queue.put_nowait(_WAKE)

    pump_task = asyncio.create_task(pump())
    turn.wake_relay = wake
    last_seq = 0
    opening = run.HasField("open_session")
    try:
        while True:
            if turn.cancel_requested:
                pump_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pump_task
                if turn.interrupted:
                    log.info("turn interrupted by shutdown")
                    yield _event(run, last_seq + 1, error=common_pb2.RunError(
                        code="UNAVAILABLE", message=SHUTDOWN_MESSAGE, reason=error_reasons.SHUTTING_DOWN))
                    return
                log.info("turn cancelled")
                yield _event(run, last_seq + 1, run_finished=common_pb2.RunFinished(stop_reason="cancelled"))
                return
            item = await queue.get()
            if item is _WAKE:
                continue
            if item is _DONE:
                return
            if isinstance(item, AgentmeshError):
                yield _event(run, last_seq + 1, error=common_pb2.RunError(
                    code=item.code, message=item.message, reason=item.reason, metadata=item.metadata))
                return
            assert isinstance(item, common_pb2.Event)  # the pump puts events, errors and _DONE
            if opening and not last_seq and item.HasField("error"):
                # The agent could not open the session (memory refused or is away): the
                # client gets the status the gateway's own PutSession answered with before.
                raise error_of_code(item.error.code, item.error.message, reason=item.error.reason,
                                    metadata=item.error.metadata)
            if item.HasField("error") and not item.error.reason:
                # An agent from before reasons: every error the gateway returns carries one.
                item.error.reason = error_reasons.default_reason(item.error.code)
            last_seq = max(last_seq, item.seq)
            yield item
    finally:
        turn.wake_relay = None
        if not pump_task.done():
            pump_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump_task


def _event(run: agent_service_pb2.RunTurnRequest, seq: int, **payload: Any) -> common_pb2.Event:
    return common_pb2.Event(session_id=run.session_id, run_id=run.run_id, seq=seq, timestamp=time.time(), **payload)
