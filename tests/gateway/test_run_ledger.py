"""The gateway's run ledger (services/gateway/runs.py) writing its records: the runs that changed
meanwhile go to memory together, in one PutRunRecords call, each in the state it ended in; a
record memory refuses is tried again while the others are not; a drain writes what is left.
The ledger is the real one; memory's side of the port is a recorder of the calls it gets."""

from __future__ import annotations

import asyncio
import time

from agentmesh.gateway.feeds import Feed
from agentmesh.gateway.runs import RunLedger
from agentmesh.v1 import common_pb2, sessions_pb2


class RecordedRuns:
    """Memory's run records as the ledger sees them (runs.RunRecords), keeping every call."""

    def __init__(self, refuse: set[str] | None = None):
        self.calls: list[list[sessions_pb2.Run]] = []
        self.signed: list[object] = []  # for whom each call was signed
        self.refuse = refuse or set()
        self.caller: object = "alice"  # who the code beginning a run acts for

    def signer(self) -> object:
        return self.caller

    async def put_runs(self, runs: list[sessions_pb2.Run], signer: object = None) -> list[str]:
        self.calls.append(list(runs))
        self.signed.append(signer)
        return ["refused" if run.run_id in self.refuse else "" for run in runs]

    async def get_run(self, run_id: str) -> sessions_pb2.Run:
        raise AssertionError("not read here")

    async def list_runs(self, request: sessions_pb2.ListRunRecordsRequest) -> sessions_pb2.ListRunRecordsResponse:
        written = {run.run_id: run for call in self.calls for run in call}
        return sessions_pb2.ListRunRecordsResponse(runs=[run for run in written.values() if run.namespace == request.namespace])


def _finished(run_id: str) -> common_pb2.Event:
    return common_pb2.Event(run_id=run_id, seq=3, run_finished=common_pb2.RunFinished(iterations=2,
                                                                                      stop_reason="completed"))


def _run_a_turn(ledger: RunLedger, run_id: str):
    run = ledger.begin(run_id, f"s-{run_id}", "default", "user:alice")
    ledger.started(run, Feed())
    ledger.observe(run, "run_finished", _finished(run_id))
    ledger.end(run)
    return run


async def test_turns_that_end_together_are_written_in_one_call_each_as_it_ended():
    records = RecordedRuns()
    ledger = RunLedger(records)
    runs = [_run_a_turn(ledger, f"run-{i}") for i in range(3)]
    await asyncio.gather(*(run.written.wait() for run in runs))

    assert len(records.calls) == 1, [[r.run_id for r in call] for call in records.calls]
    written = records.calls[0]
    assert [r.run_id for r in written] == ["run-0", "run-1", "run-2"]
    assert all(r.state == "succeeded" and r.iterations == 2 and r.last_event_seq == 3 and r.finished_at
               for r in written)


async def test_each_callers_runs_are_written_signed_for_that_caller():
    # Runs of two tenants' callers ending together: never one call signed for one of them.
    records = RecordedRuns()
    ledger = RunLedger(records)
    alices = _run_a_turn(ledger, "run-a")
    records.caller = "bob"
    bobs = _run_a_turn(ledger, "run-b")
    await asyncio.gather(alices.written.wait(), bobs.written.wait())

    written = {signer: [r.run_id for r in call] for signer, call in zip(records.signed, records.calls, strict=True)}
    assert written == {"alice": ["run-a"], "bob": ["run-b"]}


async def test_a_run_whose_record_is_not_written_yet_is_listed_by_its_replica():
    records = RecordedRuns()
    ledger = RunLedger(records)
    run = ledger.begin("run-new", "s-new", "default", "user:alice")  # written a second from now
    listed = await ledger.list(sessions_pb2.ListRunRecordsRequest(namespace="default"))
    assert [r.run_id for r in listed.runs] == ["run-new"] and not records.calls
    ledger.started(run, Feed())
    ledger.observe(run, "run_finished", _finished("run-new"))
    ledger.end(run)
    await run.written.wait()
    listed = await ledger.list(sessions_pb2.ListRunRecordsRequest(namespace="default"))
    assert [(r.run_id, r.state) for r in listed.runs] == [("run-new", "succeeded")]  # once, as memory has it


async def test_a_refused_end_is_tried_again_alone_and_a_drain_writes_what_is_left():
    records = RecordedRuns(refuse={"run-bad"})
    ledger = RunLedger(records)
    _run_a_turn(ledger, "run-good")
    _run_a_turn(ledger, "run-bad")
    await ledger.drain()

    assert [r.run_id for r in records.calls[0]] == ["run-good", "run-bad"]
    # The refused end again, alone, until the retries are spent; the stored one never again.
    assert len(records.calls) > 1 and all([r.run_id for r in call] == ["run-bad"] for call in records.calls[1:])


class StoredRuns(RecordedRuns):
    """Memory holding runs another replica wrote (`stored`), and what this ledger writes."""

    def __init__(self, *stored: sessions_pb2.Run):
        super().__init__()
        self.stored = {run.run_id: run for run in stored}

    async def get_run(self, run_id: str) -> sessions_pb2.Run:
        written = {run.run_id: run for call in self.calls for run in call}
        return written.get(run_id) or self.stored[run_id]

    async def list_runs(self, request: sessions_pb2.ListRunRecordsRequest) -> sessions_pb2.ListRunRecordsResponse:
        runs = {**self.stored, **{run.run_id: run for call in self.calls for run in call}}
        return sessions_pb2.ListRunRecordsResponse(runs=[_copy(r) for r in runs.values()])


def _copy(run: sessions_pb2.Run) -> sessions_pb2.Run:
    copy = sessions_pb2.Run()
    copy.CopyFrom(run)
    return copy


def _stored(run_id: str, age_s: float, state: str = "running") -> sessions_pb2.Run:
    now = time.time()
    return sessions_pb2.Run(run_id=run_id, session_id=f"s-{run_id}", namespace="default", state=state,
                            created_at=now - age_s - 5, updated_at=now - age_s, started_by="user:alice")


async def test_a_run_whose_gateway_was_lost_is_recorded_interrupted_by_the_replica_reading_it():
    records = StoredRuns(_stored("run-lost", age_s=60), _stored("run-live", age_s=1), _stored("run-done", 60, "succeeded"))
    ledger = RunLedger(records, lease_s=30)
    ended: list[sessions_pb2.Run] = []
    ledger.on_end = ended.append

    lost = await ledger.get("run-lost")
    assert (lost.state, lost.error_reason) == ("interrupted", "GATEWAY_LOST") and lost.finished_at
    assert "stopped before it ended" in lost.error_message
    assert [r.run_id for r in ended] == ["run-lost"]
    assert (await ledger.get("run-live")).state == "running"  # within its lease
    assert (await ledger.get("run-done")).state == "succeeded"
    await ledger.drain()
    assert [(r.run_id, r.state) for call in records.calls for r in call] == [("run-lost", "interrupted")]
    # Read again, or listed: the same end, not a second one.
    assert (await ledger.get("run-lost")).state == "interrupted" and len(ended) == 1
    listed = await ledger.list(sessions_pb2.ListRunRecordsRequest(namespace="default"))
    assert sorted((r.run_id, r.state) for r in listed.runs) == [
        ("run-done", "succeeded"), ("run-live", "running"), ("run-lost", "interrupted")]


async def test_a_run_going_on_has_its_record_refreshed_within_its_lease():
    records = StoredRuns()
    ledger = RunLedger(records, lease_s=0.6)
    run = ledger.begin("run-long", "s-long", "default", "user:alice")
    ledger.started(run, Feed())
    while len([r for call in records.calls for r in call if r.run_id == "run-long"]) < 3:
        await asyncio.sleep(0.05)
    written = [r for call in records.calls for r in call if r.run_id == "run-long"]
    assert all(r.state == "running" for r in written)
    assert written[-1].updated_at > written[0].updated_at
    ledger.observe(run, "run_finished", _finished("run-long"))
    ledger.end(run)
    await ledger.drain()
