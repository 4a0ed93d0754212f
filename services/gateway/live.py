"""The running turns as others see them: each turn's events so far, for a client that attaches
to it (`AttachTurn`, `agentmesh chat --attach`), and the tool activity of them all, for an
operator watching (`WatchActivity`, `agentmesh activity`).

Plain async Python. The core hands every event it relays to `publish`; nothing here slows a
turn down: a feed is a list (feeds.py), and a watcher that falls more than `WATCH_BACKLOG`
events behind is dropped with a sentence rather than allowed to hold memory or the turn.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, TypeVar, cast

from agentmesh import error_reasons
from agentmesh.errors import InvalidArgument, NotFound, ResourceExhausted, Unavailable
from agentmesh.gateway.feeds import Feed
from agentmesh.ids import validate_id
from agentmesh.v1 import common_pb2, gateway_pb2

__all__ = ["ACTIVITY_KINDS", "LiveTurns", "merged"]

T = TypeVar("T")

# The events an operator's view shows: what runs and what it does, not its text.
ACTIVITY_KINDS = ("run_started", "tool_call", "tool_result", "approval_request", "run_finished", "error")
TERMINAL = ("run_finished", "error")
WATCH_BACKLOG = 4096
MAX_WATCHED_SESSIONS = 256


@dataclass(eq=False)
class _Watcher:
    sessions: frozenset[str]
    visible: Callable[[str], bool]  # the namespaces the watcher may see
    queue: asyncio.Queue[gateway_pb2.Activity] = field(default_factory=lambda: asyncio.Queue(WATCH_BACKLOG))
    lagged: asyncio.Event = field(default_factory=asyncio.Event)


def activity_of(event: common_pb2.Event, replica: str) -> gateway_pb2.Activity | None:
    kind = event.WhichOneof("payload")
    if kind not in ACTIVITY_KINDS:
        return None
    activity = gateway_pb2.Activity(session_id=event.session_id, run_id=event.run_id, timestamp=event.timestamp,
                                    gateway=replica)
    getattr(activity, kind).CopyFrom(getattr(event, kind))
    return activity


class LiveTurns:
    def __init__(self, replica: str = ""):
        self.replica = replica  # this gateway's address, as the others know it ("" alone)
        self._feeds: dict[str, Feed[common_pb2.Event]] = {}
        self._watchers: set[_Watcher] = set()
        self._namespaces: dict[int, str] = {}  # each running feed's session namespace
        self._closing = asyncio.Event()

    async def drain(self, grace_s: float) -> None:
        """On shutdown: end every watch at once (they would otherwise hold the server for its
        whole grace period); attached clients follow their turns, which the core drains."""
        self._closing.set()

    # --- the core's side ------------------------------------------------------------------

    def begin(self, session_id: str, namespace: str = "default") -> Feed[common_pb2.Event]:
        feed: Feed[common_pb2.Event] = Feed()
        self._feeds[session_id] = feed
        self._namespaces[id(feed)] = namespace
        return feed

    def set_namespace(self, feed: Feed[common_pb2.Event], namespace: str) -> None:
        """The session's namespace as the turn found it (run_started), for the watchers' view."""
        if id(feed) in self._namespaces:
            self._namespaces[id(feed)] = namespace

    def publish(self, feed: Feed[common_pb2.Event], event: common_pb2.Event) -> None:
        feed.add(event)
        if not self._watchers:
            return
        activity = activity_of(event, self.replica)
        if activity is None:
            return
        namespace = self._namespaces.get(id(feed), "default")
        for watcher in list(self._watchers):
            if watcher.sessions and event.session_id not in watcher.sessions:
                continue
            if not watcher.visible(namespace):
                continue
            try:
                watcher.queue.put_nowait(activity)
            except asyncio.QueueFull:
                watcher.lagged.set()
                self._watchers.discard(watcher)

    def end(self, session_id: str, feed: Feed[common_pb2.Event]) -> None:
        feed.finish()
        self._namespaces.pop(id(feed), None)
        if self._feeds.get(session_id) is feed:
            del self._feeds[session_id]

    # --- the readers' side ----------------------------------------------------------------

    async def attach(self, session_id: str, after_seq: int) -> AsyncIterator[common_pb2.Event]:
        """The running turn's events with seq > after_seq, then the live ones, to its end."""
        validate_id(session_id)
        if after_seq < 0:
            raise InvalidArgument("after_seq must not be negative")
        feed = self._feeds.get(session_id)
        if feed is None:
            raise NotFound(f"session {session_id!r} has no turn running now; its transcript has what earlier turns did")
        async for event in feed.follow():
            if event.seq > after_seq:
                yield event
            if event.WhichOneof("payload") in TERMINAL:
                return

    async def watch(self, session_ids: list[str],
                    visible: Callable[[str], bool] = lambda namespace: True) -> AsyncIterator[gateway_pb2.Activity]:
        """Activity of every running turn (of `session_ids` only, when given) from now on,
        until the caller goes away. The first item has no payload: it says the watch is live."""
        if len(session_ids) > MAX_WATCHED_SESSIONS:
            raise InvalidArgument(f"session_ids lists {len(session_ids)} sessions; at most {MAX_WATCHED_SESSIONS}")
        for session_id in session_ids:
            validate_id(session_id)
        if self._closing.is_set():
            raise Unavailable("the gateway is shutting down; watch again in a moment")
        watcher = _Watcher(frozenset(session_ids), visible)
        self._watchers.add(watcher)
        lagged = asyncio.ensure_future(watcher.lagged.wait())
        closing = asyncio.ensure_future(self._closing.wait())
        try:
            # First, an activity without payload: this replica is watched from here on.
            yield gateway_pb2.Activity(gateway=self.replica, timestamp=time.time())
            while True:
                getter = asyncio.ensure_future(watcher.queue.get())
                done, _ = await asyncio.wait({getter, lagged, closing}, return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    yield getter.result()
                    continue
                getter.cancel()
                if closing in done:
                    return
                while not watcher.queue.empty():
                    yield watcher.queue.get_nowait()
                raise ResourceExhausted(
                    f"this activity stream fell more than {WATCH_BACKLOG} events behind and was stopped; watch again",
                    reason=error_reasons.WATCHER_TOO_SLOW)
        finally:
            lagged.cancel()
            closing.cancel()
            self._watchers.discard(watcher)


async def merged(sources: list[AsyncIterator[T]]) -> AsyncIterator[T]:
    """The items of every source as they come. The first source is the one that counts: when it
    ends or fails, so does the whole; another source that ends just stops contributing."""
    queue: asyncio.Queue[tuple[int, object]] = asyncio.Queue()
    done = object()

    async def pump(index: int, source: AsyncIterator[T]) -> None:
        try:
            async for item in source:
                await queue.put((index, item))
        except Exception as exc:  # noqa: BLE001 - handed to the reader, who decides
            await queue.put((index, exc))
        finally:
            await queue.put((index, done))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(sources)]
    try:
        while True:
            index, item = await queue.get()
            if item is done:
                if index == 0:
                    return
                continue
            if isinstance(item, Exception):
                if index == 0:
                    raise item
                continue
            yield cast(T, item)  # neither `done` nor an exception: an item its source yielded
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
