"""Runs: every turn this gateway relays is a run (sessions.proto `Run`, docs/api.md "Runs"),
with a state, timestamps, usage and stop reason, recorded in memory so that any replica can
read, list, join and cancel it.

Recording costs the turn nothing on its critical path: the core tells the ledger what each event
means (`observe`, a few attribute writes) and the ledger writes the records to memory from one
task of its own: once a second, the latest state of every run that changed meanwhile, in one
`PutRunRecords` call — a replica running many turns makes a write a second, not one per turn.
A run is written when its state changes (start, waiting for an approval and back, end), not per
event, and a turn that ends within FIRST_WRITE_DELAY_S of its start is written once, ended.
A CreateRun waiting on the first write has it at once. A write that fails is logged and
retried with the next change (an end, a few times); the turn never waits on it.

A lease says a run is still relayed: the ledger writes its unfinished runs again (their
`updated_at`) every third of `lease_s`. A record that says a run goes on but has not been
refreshed for longer than `lease_s` lost its gateway (a replica killed mid-turn, before it could
record the end): the replica that reads it — GetRun, ListRuns, a teammate's lead — records it
`interrupted` (reason GATEWAY_LOST) and ends it as its own, so `on_end` (webhooks, a teammate's
restart) follows as for any run.

The run's events are the session's live feed (live.py); the ledger keeps the feeds of the last
RECENT_RUNS runs after they end, so JoinRun can replay a finished run from its first event on the
replica that ran it. Elsewhere (another replica after a restart), a finished run is joined as one
closing event made from its record.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, Hashable, Protocol

from agentmesh import error_reasons
from agentmesh.errors import NotFound
from agentmesh.gateway.authz import Caller
from agentmesh.gateway.feeds import Feed
from agentmesh.logs import get_logger
from agentmesh.v1 import common_pb2, sessions_pb2

__all__ = ["TERMINAL_STATES", "LocalRun", "RunLedger", "RunRecords", "closing_event", "require_run"]

log = get_logger("agentmesh.gateway")

TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled", "interrupted"})
RECENT_RUNS = 256
WRITE_RETRIES = 5
# The ledger writes what changed meanwhile this often, in one call (a failed write is tried again
# on the next pass); at once when a CreateRun waits on a run's first write.
WRITE_EVERY_S = 1.0
# A turn's record is first written this long after it starts, unless someone waits on it (a
# CreateRun): most turns end sooner, and then only their final record is written — one memory
# write per turn instead of two. A run that is still going by then is written as running.
FIRST_WRITE_DELAY_S = 1.0
# A run's lease, by default (GatewaySettings.run_lease_s): its record is refreshed thrice within it.
LEASE_S = 30.0
UNFINISHED_STATES = frozenset({"queued", "running", "waiting_for_approval"})
LOST_MESSAGE = ("the gateway replica relaying this run stopped before it ended (its record was not refreshed for "
                "{lease:g}s); its transcript holds what it did")
# run_finished's stop reasons that are not a success of the run itself.
_STATE_OF_STOP = {"cancelled": "cancelled", "interrupted": "interrupted", "rolled_back": "cancelled"}


class RunRecords(Protocol):
    """Memory's run records (peers.MemorySessions implements it)."""

    def signer(self) -> Hashable:
        """Who the calling code acts for now: a run's record is written on its behalf."""
        ...

    async def put_runs(self, runs: list[sessions_pb2.Run], signer: Hashable = None) -> list[str]: ...
    async def get_run(self, run_id: str) -> sessions_pb2.Run: ...
    async def list_runs(self, request: sessions_pb2.ListRunRecordsRequest) -> sessions_pb2.ListRunRecordsResponse: ...


@dataclass(eq=False)
class LocalRun:
    record: sessions_pb2.Run
    feed: Feed[common_pb2.Event] | None = None
    # Set once the turn holds its session or waits in line for it, or was refused (CreateRun
    # returns then), and once the record's first write is done (a replica can then find it).
    accepted: asyncio.Event = field(default_factory=asyncio.Event)
    written: asyncio.Event = field(default_factory=asyncio.Event)
    # Set once its feed is there (it started) or it ended without one.
    began: asyncio.Event = field(default_factory=asyncio.Event)
    dirty: bool = False
    queued: bool = False
    retries: int = 0  # failed writes of its end, tried again (WRITE_RETRIES)
    # A CreateRun waits for the record's first write: written at once, not after the delay.
    awaited: bool = False
    # On whose behalf its record is written (RunRecords.signer at begin): a pass writes the runs
    # of each caller in a call of its own, so one tenant's run is never signed as another's.
    signer: Hashable = None


def require_run(caller: Caller, run: sessions_pb2.Run, rpc: str) -> sessions_pb2.Run:
    """The run if `caller` holds the rpc's role in its namespace's tenant; another tenant's run
    is NOT_FOUND with the sentence of one that does not exist."""
    caller.scope.require(run.namespace or "default", caller.role(rpc), f"there is no run {run.run_id!r}")
    return run


def closing_event(run: sessions_pb2.Run) -> common_pb2.Event:
    """A finished run's end, made from its record: what JoinRun sends where its events are gone."""
    event = common_pb2.Event(session_id=run.session_id, run_id=run.run_id, seq=max(run.last_event_seq, 1),
                             timestamp=run.finished_at or time.time())
    if run.state in ("failed", "interrupted") and run.error_code:
        event.error.CopyFrom(common_pb2.RunError(code=run.error_code, message=run.error_message,
                                                 reason=run.error_reason))
    else:
        event.run_finished.CopyFrom(common_pb2.RunFinished(usage=run.usage, iterations=run.iterations,
                                                           trace_id=run.trace_id, stop_reason=run.stop_reason))
    return event


class RunLedger:
    def __init__(self, records: RunRecords | None = None, lease_s: float = LEASE_S):
        # None: no memory to record to (a core driven alone); runs are then this replica's only.
        self._records = records
        self.lease_s = lease_s
        self._heartbeat: asyncio.Task[None] | None = None
        self._running: dict[str, LocalRun] = {}
        self._recent: OrderedDict[str, LocalRun] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        self._expected: dict[str, list[asyncio.Future[LocalRun]]] = {}
        self._webhook_urls: dict[str, str] = {}
        # The runs with changes not yet written, and the one task writing them (_flush).
        self._dirty: dict[str, LocalRun] = {}
        self._flusher: asyncio.Task[None] | None = None
        self._due_now = asyncio.Event()
        self._closing = False
        # Called with each ended run (webhooks.py delivers it to its webhook or its namespace's).
        self.on_end: Callable[[sessions_pb2.Run], None] | None = None

    # --- the core's side ------------------------------------------------------------------

    def begin(self, run_id: str, session_id: str, namespace: str, started_by: str) -> LocalRun:
        now = time.time()
        run = LocalRun(sessions_pb2.Run(run_id=run_id, session_id=session_id, namespace=namespace or "default",
                                        state="queued", created_at=now, updated_at=now, started_by=started_by))
        run.record.webhook_url = self._webhook_urls.pop(run_id, "")
        run.signer = self._records.signer() if self._records is not None else None
        self._running[run_id] = run
        run.awaited = run_id in self._expected
        for waiter in self._expected.pop(run_id, ()):
            if not waiter.done():
                waiter.set_result(run)
        if self._records is not None and (self._heartbeat is None or self._heartbeat.done()):
            self._heartbeat = asyncio.create_task(self._refresh())
            self._tasks.add(self._heartbeat)
            self._heartbeat.add_done_callback(self._tasks.discard)
        return run

    def expect(self, run_id: str, webhook_url: str = "") -> asyncio.Future[LocalRun]:
        """Resolved when the core begins run `run_id` (CreateRun waits on it), which then names
        `webhook_url`."""
        if webhook_url:
            self._webhook_urls[run_id] = webhook_url
        waiter: asyncio.Future[LocalRun] = asyncio.get_running_loop().create_future()
        self._expected.setdefault(run_id, []).append(waiter)
        return waiter

    def forget_expected(self, run_id: str) -> None:
        self._expected.pop(run_id, None)
        self._webhook_urls.pop(run_id, None)

    def queued(self, run: LocalRun) -> None:
        """The turn waits in line behind the session's running one (if_busy enqueue)."""
        run.queued = True
        run.accepted.set()
        self._save(run)

    def started(self, run: LocalRun, feed: Feed[common_pb2.Event]) -> None:
        run.feed = feed
        run.record.state = "running"
        run.record.started_at = time.time()
        run.accepted.set()
        run.began.set()
        self._save(run)

    def observe(self, run: LocalRun, kind: str | None, event: common_pb2.Event) -> None:
        """What a relayed event changes in the run; written when its state changes."""
        record = run.record
        record.last_event_seq = max(record.last_event_seq, event.seq)
        if kind == "run_started":
            record.trace_id = event.run_started.trace_id or record.trace_id
            if event.run_started.namespace and event.run_started.namespace != record.namespace:
                record.namespace = event.run_started.namespace
                self._save(run)
        elif kind == "approval_request" and record.state == "running":
            record.state = "waiting_for_approval"
            self._save(run)
        elif kind == "approval_resolved" and record.state == "waiting_for_approval":
            record.state = "running"
            self._save(run)
        elif kind == "run_finished":
            finished = event.run_finished
            record.usage.CopyFrom(finished.usage)
            record.iterations, record.stop_reason = finished.iterations, finished.stop_reason
            record.trace_id = finished.trace_id or record.trace_id
            record.state = _STATE_OF_STOP.get(finished.stop_reason, "succeeded")
        elif kind == "error":
            error = event.error
            record.error_code, record.error_reason, record.error_message = error.code, error.reason, error.message
            record.state = "interrupted" if error.reason == "SHUTTING_DOWN" else "failed"

    def end(self, run: LocalRun, failure: BaseException | None = None) -> None:
        """The turn's call is over: the run ends in the state its last event said, or failed
        (refused before its first event, or its relay broke)."""
        record = run.record
        if self._running.get(record.run_id) is run:
            del self._running[record.run_id]
        run.accepted.set()
        run.began.set()
        if not record.started_at and not run.queued:
            # Refused before it held its session or waited for it (busy, over a limit, another
            # tenant's session): no run was made, and nothing is recorded.
            record.state = "failed"
            return
        if record.state not in TERMINAL_STATES:
            if isinstance(failure, (asyncio.CancelledError, GeneratorExit)):
                # The stream it ran for was closed (a gRPC Chat whose client went away).
                record.state = "interrupted"
                record.error_message = "the stream the turn ran for was closed before it ended"
            else:
                record.state = "failed"
                record.error_code = str(getattr(failure, "code", "INTERNAL"))
                record.error_reason = str(getattr(failure, "reason", "") or "")
                record.error_message = str(getattr(failure, "message", "") or failure or "the turn ended without a result")[:2000]
        record.finished_at = time.time()
        if record.webhook_url:
            # In the run's final write: the delivery is durable before it is tried.
            record.webhook_state = "pending"
        self._keep(run)
        self._save(run)
        if self.on_end is not None:
            self.on_end(record)

    def update_webhook(self, run: sessions_pb2.Run) -> None:
        """A delivery's progress (its attempts, its state), written through this ledger so the
        run's writes stay in order — whichever replica ran it."""
        local = self.local(run.run_id)
        if local is None:
            local = LocalRun(_copy(run))
            local.began.set()
            self._keep(local)
        local.record.webhook_url, local.record.webhook_state = run.webhook_url, run.webhook_state
        del local.record.webhook_attempts[:]
        local.record.webhook_attempts.extend(run.webhook_attempts)
        self._save(local)

    def _keep(self, run: LocalRun) -> None:
        self._recent[run.record.run_id] = run
        while len(self._recent) > RECENT_RUNS:
            self._recent.popitem(last=False)

    # --- the readers' side ----------------------------------------------------------------

    def local(self, run_id: str) -> LocalRun | None:
        """The run if this replica runs it or ran it lately."""
        return self._running.get(run_id) or self._recent.get(run_id)

    async def get(self, run_id: str) -> sessions_pb2.Run:
        """This replica's view when it has the run (fresher than memory's), else memory's."""
        local = self.local(run_id)
        if local is not None:
            return local.record
        if self._records is None:
            raise NotFound(f"there is no run {run_id!r}")
        run = await self._records.get_run(run_id)
        return self.reclaim(run) if self.lost(run) else run

    def lost(self, run: sessions_pb2.Run, now: float | None = None) -> bool:
        """Whether memory's record says `run` goes on while no replica has refreshed it for
        longer than its lease, and this replica does not run it."""
        return (run.state in UNFINISHED_STATES and self.local(run.run_id) is None
                and (now or time.time()) - (run.updated_at or run.created_at) > self.lease_s)

    def reclaim(self, run: sessions_pb2.Run) -> sessions_pb2.Run:
        """A run whose gateway was lost, ended here as `interrupted`: written, kept among this
        replica's recent runs (so it reads the same here from now on), and handed to `on_end`."""
        local = LocalRun(_copy(run))
        record = local.record
        record.state = "interrupted"
        record.error_code, record.error_reason = "UNAVAILABLE", error_reasons.GATEWAY_LOST
        record.error_message = LOST_MESSAGE.format(lease=self.lease_s)
        record.finished_at = time.time()
        local.began.set()
        local.signer = self._records.signer() if self._records is not None else None
        if record.webhook_url:
            record.webhook_state = "pending"
        self._keep(local)
        self._save(local)
        log.warning("run lost its gateway; recorded interrupted", run_id=record.run_id, session_id=record.session_id)
        if self.on_end is not None:
            self.on_end(record)
        return record

    async def list(self, request: sessions_pb2.ListRunRecordsRequest) -> sessions_pb2.ListRunRecordsResponse:
        mine = [r.record for r in [*self._running.values(), *self._recent.values()] if _listed(r.record, request)]
        if self._records is None:
            mine.sort(key=lambda run: -run.created_at)
            return sessions_pb2.ListRunRecordsResponse(runs=mine)
        reply = await self._records.list_runs(request)
        # Runs of this replica are fresher here than in memory (a write may be on its way).
        now = time.time()
        for run in reply.runs:
            local = self.local(run.run_id)
            if local is not None:
                run.CopyFrom(local.record)
            elif self.lost(run, now):
                run.CopyFrom(self.reclaim(run))
        # A first page also shows this replica's runs whose first write has not landed yet (the
        # ledger writes once a second): a run that just started or ended is never missing here.
        if not request.page_token and not request.webhook_pending:
            listed = {run.run_id for run in reply.runs}
            unwritten = [_copy(run) for run in mine if run.run_id not in listed and not self._written(run.run_id)]
            if unwritten:
                runs = sorted([*reply.runs, *unwritten], key=lambda run: -run.created_at)
                del reply.runs[:]
                reply.runs.extend(runs)  # a page may then hold a few more than its size: never one less
        return reply

    def _written(self, run_id: str) -> bool:
        local = self.local(run_id)
        return local is not None and local.written.is_set() and not local.dirty

    async def events(self, run: LocalRun, after_seq: int) -> AsyncIterator[common_pb2.Event]:
        """The run's events with seq > after_seq from its feed, to its last."""
        await run.began.wait()  # a run in line for its session has no feed before it starts
        if run.feed is None:
            yield closing_event(run.record)
            return
        async for event in run.feed.follow():
            if event.run_id != run.record.run_id:
                continue
            if event.seq > after_seq:
                yield event
            if event.WhichOneof("payload") in ("run_finished", "error"):
                return

    async def drain(self) -> None:
        """On shutdown: write what is left at once, and let the writes finish."""
        self._closing = True
        self._due_now.set()
        if self._heartbeat is not None:
            self._heartbeat.cancel()  # sleeping out its pause; the writes below are the last
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # --- writing ----------------------------------------------------------------------------

    async def _refresh(self) -> None:
        """The lease: while this replica relays runs, each one's record is written again every
        third of the lease (with the ledger's other writes), so no reader takes it for lost."""
        while self._running and not self._closing:
            await asyncio.sleep(self.lease_s / 3)
            for run in list(self._running.values()):
                if run.record.state in UNFINISHED_STATES and not run.dirty:
                    self._save(run)

    def _save(self, run: LocalRun) -> None:
        run.record.updated_at = time.time()
        if self._records is None:
            run.written.set()
            return
        run.dirty = True
        self._dirty[run.record.run_id] = run
        if run.awaited or run.record.webhook_url:
            # Someone waits on this write (CreateRun), or a webhook delivery is about to be tried
            # on the strength of it: written at once, with whatever else is due.
            self._due_now.set()
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
            self._tasks.add(self._flusher)
            self._flusher.add_done_callback(self._tasks.discard)

    def _due(self, run: LocalRun, now: float) -> bool:
        """Whether `run`'s changes are written in this pass: a run still going is first written
        FIRST_WRITE_DELAY_S after it was created (most turns have ended by then), unless waited on."""
        return (run.awaited or run.written.is_set() or run.record.state in TERMINAL_STATES
                or bool(run.record.webhook_url) or self._closing
                or now - run.record.created_at >= FIRST_WRITE_DELAY_S)

    async def _flush(self) -> None:
        """The ledger's one writer: every WRITE_EVERY_S (at once when something is waited on),
        the latest state of each run changed meanwhile that is due, in one PutRunRecords call —
        a write per second for a replica's runs, not a call per turn. One pass at a time, so
        each run's writes land in order."""
        assert self._records is not None
        while self._dirty:
            if not self._closing:
                try:
                    await asyncio.wait_for(self._due_now.wait(), WRITE_EVERY_S)
                except TimeoutError:
                    pass
            self._due_now.clear()
            now = time.time()
            batch = [run for run in self._dirty.values() if self._due(run, now)]
            if not batch:
                continue
            snapshots = []
            for run in batch:
                del self._dirty[run.record.run_id]
                run.dirty = False
                snapshots.append(_copy(run.record))
            errors = await _put_by_signer(self._records, batch, snapshots)
            for run, snapshot, error in zip(batch, snapshots, errors, strict=True):
                if error:
                    log.warning("run record not written", run_id=snapshot.run_id, error=error)
                    if snapshot.state in TERMINAL_STATES and run.retries < WRITE_RETRIES and not run.dirty:
                        # The end must land, or the run reads as running forever: tried again
                        # with the next passes, a few times.
                        run.retries += 1
                        run.dirty = True
                        self._dirty.setdefault(run.record.run_id, run)
                # Set after a failed first write too: CreateRun answers, and GetRun on this replica works.
                run.written.set()


async def _put_by_signer(records: RunRecords, batch: list[LocalRun], snapshots: list[sessions_pb2.Run]) -> list[str]:
    """The snapshots written, a call per signer; per snapshot, "" or why it was not stored."""
    by_signer: dict[Hashable, list[int]] = {}
    for index, run in enumerate(batch):
        by_signer.setdefault(run.signer, []).append(index)
    errors = [""] * len(snapshots)
    for signer, indexes in by_signer.items():
        try:
            said = await records.put_runs([snapshots[i] for i in indexes], signer)
        except Exception as exc:  # noqa: BLE001 - recording must never fail the turn
            said = [str(exc)] * len(indexes)
        for index, error in zip(indexes, said, strict=True):
            errors[index] = error
    return errors


def _listed(run: sessions_pb2.Run, request: sessions_pb2.ListRunRecordsRequest) -> bool:
    """Whether `run` answers the listing's filters."""
    return (run.namespace == request.namespace
            and (not request.session_id or run.session_id == request.session_id)
            and (not request.states or run.state in request.states)
            and (not request.created_after or run.created_at >= request.created_after)
            and (not request.created_before or run.created_at < request.created_before))


def _copy(run: sessions_pb2.Run) -> sessions_pb2.Run:
    copy = sessions_pb2.Run()
    copy.CopyFrom(run)
    return copy
