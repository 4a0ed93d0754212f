"""One rule of the turn, in one place: **a tool result is shown only once it is saved, while
the next model call already runs.**

A step's tool results are the last thing a step saves before the next model call, and that
call needs nothing from the write: the results are in the turn's messages already. So the last
results of a step are handed over unsaved (`hold`), and the next model call starts beside
their save (`beside`). Until the save is acknowledged nothing of the turn is shown: the
results and every event emitted meanwhile (the reply's streamed deltas included) are withheld,
then shown in order; the reply is returned — and so persisted, shown or acted on — only after
the save. If the save fails or the turn is stopped meanwhile, the call is cancelled, the error
is the save's, and nothing withheld is ever shown.

    shown = ShowAfterSave(show)          # show: where the turn's events go (its stream)
    shown.emit(event)                    # every event of the turn goes through here
    shown.hold(save, result_events)      # a step's last results: run, not saved yet
    reply = await shown.beside(call)     # the next model call, beside their save
    await shown.save()                   # before any other write: what follows comes after them
    await shown.settle(timeout_s)        # the turn ended before a call took the save

Plain asyncio: it knows nothing of the loop, the transcript or the model (tested alone in
tests/agent/test_show_after_save.py; end to end, over gRPC, in tests/agent/test_agent_overlap.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Awaitable, Callable, Generic, Sequence, TypeVar

__all__ = ["ShowAfterSave"]

E = TypeVar("E")
T = TypeVar("T")


class ShowAfterSave(Generic[E]):
    """Owns the step's unsaved results and the events withheld until they are saved."""

    def __init__(self, show: Callable[[E], None]):
        self._show = show
        self._save: Callable[[], Awaitable[None]] | None = None  # the held results' save
        self._results: Sequence[E] = ()  # their events, shown once saved
        self._withheld: list[E] | None = None  # what was emitted meanwhile; None: nothing withheld

    @property
    def pending(self) -> bool:
        """Results are held, not saved yet."""
        return self._save is not None

    def emit(self, event: E) -> None:
        """Show `event`, or withhold it while held results are unsaved."""
        if self._withheld is not None:
            self._withheld.append(event)
            return
        self._show(event)

    def hold(self, save: Callable[[], Awaitable[None]], results: Sequence[E]) -> None:
        """A step's last results, run but neither saved nor shown: `save` writes them, `results`
        are their events. From now on every event is withheld until `save` is acknowledged."""
        self._save, self._results = save, results
        self._withheld = []

    async def save(self) -> None:
        """Save the held results (nothing when none are), then show them and every event
        withheld meanwhile; if the save fails, nothing withheld is ever shown."""
        save, self._save = self._save, None
        if save is None:
            return
        results, self._results = self._results, ()
        try:
            await save()
        except BaseException:
            self._withheld = None
            raise
        withheld, self._withheld = self._withheld or [], None
        for event in results:
            self.emit(event)
        for event in withheld:
            self.emit(event)

    async def beside(self, call: Callable[[], Awaitable[T]], *, name: str | None = None) -> T:
        """`call()` (the next model call), started beside the held results' save; its answer is
        returned only once the save is acknowledged. If the save fails or this is cancelled
        meanwhile, the call is cancelled and leaves no trace. Without held results: just `call()`."""
        if self._save is None:
            return await call()
        answer = asyncio.create_task(self._after_a_hop(call), name=name)
        try:
            await self.save()
        except BaseException:
            answer.cancel()
            await asyncio.gather(answer, return_exceptions=True)
            raise
        return await answer  # a cancel here cancels the call too

    @staticmethod
    async def _after_a_hop(call: Callable[[], Awaitable[T]]) -> T:
        # One hop of the event loop first, so the save this call overlaps goes out before the
        # call's request is built and sent (the save's writer was woken after this task was
        # started). The turn's messages do not change meanwhile: the turn waits for the save.
        await asyncio.sleep(0)
        return await call()

    async def settle(self, timeout_s: float) -> None:
        """The turn ended before a model call took the save: save now, bounded; whatever
        happens, nothing stays withheld."""
        if self._save is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.save(), timeout_s)
            self._withheld = None
