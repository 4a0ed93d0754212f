"""The turn's save-before-show rule alone (agent/loop/show_after_save.py), in plain asyncio: a
step's last results are shown only once saved, while the next model call already runs. The same
rule end to end, over gRPC with a memory service that holds or refuses the save, is
tests/agent/test_agent_overlap.py."""

from __future__ import annotations

import asyncio

import pytest

from agentmesh.agent.loop.show_after_save import ShowAfterSave


class Refused(Exception):
    pass


class Save:
    """A save that waits for `done` (or fails with `error`), recording what happened when."""

    def __init__(self, log: list[str], *, error: BaseException | None = None):
        self.log, self.error = log, error
        self.done = asyncio.Event()
        self.started = asyncio.Event()
        self.calls = 0

    async def __call__(self) -> None:
        self.calls += 1
        self.log.append("save started")
        self.started.set()
        await self.done.wait()
        if self.error is not None:
            self.log.append("save failed")
            raise self.error
        self.log.append("save done")


def rule() -> tuple[ShowAfterSave[str], list[str], list[str]]:
    shown: list[str] = []
    log: list[str] = []
    return ShowAfterSave(shown.append), shown, log


async def test_without_held_results_events_are_shown_at_once_and_a_call_just_runs():
    shown_after, shown, _ = rule()
    shown_after.emit("delta")
    assert shown == ["delta"]
    assert not shown_after.pending

    async def call() -> str:
        return "reply"

    assert await shown_after.beside(call) == "reply"
    await shown_after.save()  # nothing held: nothing to do
    assert shown == ["delta"]


async def test_held_results_and_what_follows_are_shown_only_once_saved_in_order():
    shown_after, shown, log = rule()
    save = Save(log)
    shown_after.hold(save, ["result"])
    assert shown_after.pending
    shown_after.emit("status")
    assert shown == []  # withheld: the result is not saved yet
    save.done.set()
    await shown_after.save()
    assert shown == ["result", "status"]
    assert not shown_after.pending
    shown_after.emit("after")
    assert shown == ["result", "status", "after"]
    await shown_after.save()  # taken once
    assert save.calls == 1


async def test_the_call_runs_beside_the_save_and_its_reply_waits_for_it():
    shown_after, shown, log = rule()
    save = Save(log)
    shown_after.hold(save, ["result"])
    replied = asyncio.Event()

    async def call() -> str:
        log.append("call started")
        shown_after.emit("delta")  # the reply streams while the save is in flight
        replied.set()
        return "reply"

    answer = asyncio.create_task(shown_after.beside(call, name="model-call"))
    await replied.wait()
    # The save went out first, the call started without waiting for it, and finished.
    assert log == ["save started", "call started"]
    await asyncio.sleep(0.01)
    assert not answer.done()  # the reply is not returned before the save is acknowledged
    assert shown == []  # nor is anything shown
    save.done.set()
    assert await answer == "reply"
    assert shown == ["result", "delta"]
    assert log == ["save started", "call started", "save done"]


async def test_a_failed_save_cancels_the_call_raises_its_error_and_nothing_withheld_is_shown():
    shown_after, shown, log = rule()
    save = Save(log, error=Refused("memory refused"))
    shown_after.hold(save, ["result"])
    cancelled = asyncio.Event()

    async def call() -> str:
        shown_after.emit("delta")
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "reply"

    answer = asyncio.create_task(shown_after.beside(call))
    await save.started.wait()
    await asyncio.sleep(0)
    save.done.set()
    with pytest.raises(Refused):
        await answer
    assert cancelled.is_set()
    assert shown == []  # neither the result nor the reply's delta
    assert not shown_after.pending
    shown_after.emit("run_error")  # what the turn says next is shown
    assert shown == ["run_error"]


async def test_a_reply_that_came_before_a_failed_save_is_dropped_unseen():
    shown_after, shown, log = rule()
    save = Save(log, error=Refused("memory refused"))
    shown_after.hold(save, ["result"])
    finished = asyncio.Event()

    async def call() -> str:
        shown_after.emit("delta")
        finished.set()
        return "reply"

    answer = asyncio.create_task(shown_after.beside(call))
    await finished.wait()
    save.done.set()
    with pytest.raises(Refused):
        await answer
    assert shown == []


async def test_a_turn_stopped_during_the_save_cancels_the_call_and_shows_nothing():
    shown_after, shown, log = rule()
    save = Save(log)
    shown_after.hold(save, ["result"])
    call_cancelled = asyncio.Event()

    async def call() -> str:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            call_cancelled.set()
            raise
        return "reply"

    answer = asyncio.create_task(shown_after.beside(call))
    await save.started.wait()
    answer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await answer
    assert call_cancelled.is_set()
    assert shown == []
    shown_after.emit("run_finished")
    assert shown == ["run_finished"]


async def test_a_write_after_the_results_saves_them_first():
    """What the turn persists next comes after the held results (the loop's `_persist`)."""
    shown_after, shown, log = rule()
    save = Save(log)
    save.done.set()
    shown_after.hold(save, ["result"])
    shown_after.emit("status")
    await shown_after.save()
    log.append("next write")
    assert log == ["save started", "save done", "next write"]
    assert shown == ["result", "status"]


async def test_settle_saves_what_no_call_took_bounded_and_withholds_nothing_after():
    shown_after, shown, log = rule()
    save = Save(log)
    save.done.set()
    shown_after.hold(save, ["result"])
    await shown_after.settle(1.0)
    assert shown == ["result"]

    slow = Save(log)  # never acknowledged
    shown_after.hold(slow, ["late result"])
    shown_after.emit("status")
    await shown_after.settle(0.05)
    assert shown == ["result"]  # the unsaved result and what it held back are never shown
    assert not shown_after.pending
    shown_after.emit("run_finished")
    assert shown == ["result", "run_finished"]


async def test_settle_with_nothing_held_does_nothing():
    shown_after, shown, _ = rule()
    await shown_after.settle(0.01)
    shown_after.emit("run_finished")
    assert shown == ["run_finished"]
