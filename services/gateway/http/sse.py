"""Chat over Server-Sent Events, and resuming a dropped stream.

A turn started over HTTP runs in a `TurnFeed`: a task reads the gRPC Chat stream into a list
that any number of HTTP responses follow. A client that drops its connection does not stop the
turn (Cancel does); it reconnects with `Last-Event-ID` and continues where it was.

Event ids are transcript positions. Every event of a running turn has the id `B.N`: B is the
session's transcript position when the turn began, N the event's place in the turn. The last
event (run_finished or error) has the id P, the transcript position after the turn. Resuming:

- `B.N` while this gateway still holds that turn's feed (it runs, or ended under a minute ago):
  the events after N, then the live ones — nothing twice, nothing missed;
- otherwise `B.N` or `P`: the transcript from that position on, one `message` event per entry
  (id = its seq), then the live events of a turn running now, if any.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from typing import Any, AsyncIterator, Awaitable, Callable

from agentmesh.errors import InvalidArgument
from agentmesh.gateway.feeds import Feed
from agentmesh.gateway.http.transcode import to_json
from agentmesh.v1 import common_pb2, sessions_pb2

# How long a finished turn's events stay to resume from before the transcript takes over.
FEED_RETENTION_S = 60.0


def sse_message(event_id: str, kind: str, data: dict[str, Any]) -> bytes:
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    # No id line for an id-less message: an empty `id:` would reset the client's Last-Event-ID.
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {kind}\ndata: {payload}\n\n".encode()


class TurnFeed(Feed[bytes]):
    """A turn started over HTTP, as the SSE messages its clients follow (feeds.py)."""

    def __init__(self, session_id: str, base: int):
        super().__init__()
        self.session_id = session_id
        self.base = base
        self.task: asyncio.Task[None] | None = None

    @property
    def messages(self) -> list[bytes]:
        return self.items


# What this server sends as event ids, exactly: `P` or `B.N`, ASCII digits, at most 18 each (so
# every id fits the transcript's 64-bit positions). int() would take more: spaces, signs, "1_0",
# other scripts' digits, and numbers past any position.
EVENT_ID_PATTERN = r"^[0-9]{1,18}(\.[0-9]{1,18})?$"
_EVENT_ID = re.compile(EVENT_ID_PATTERN)


def parse_last_event_id(text: str) -> tuple[int, int | None]:
    """`B.N` -> (B, N); `P` -> (P, None). Anything else is not an id this server sent."""
    if not _EVENT_ID.fullmatch(text):
        raise InvalidArgument(
            f"Last-Event-ID {text[:64]!r} is not an event id of this API: 'B.N' or 'P', "
            "each a whole number of at most 18 digits"
        )
    base, dot, index = text.partition(".")
    return int(base), int(index) if dot else None


class TurnFeeds:
    """The turns this gateway runs for HTTP clients, by session."""

    def __init__(self) -> None:
        self._feeds: dict[str, TurnFeed] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def get(self, session_id: str) -> TurnFeed | None:
        return self._feeds.get(session_id)

    def start(
        self,
        session_id: str,
        base: int,
        first: common_pb2.Event,
        rest: AsyncIterator[common_pb2.Event],
        end_position: Callable[[], Awaitable[int]],
        on_failure: Callable[[BaseException], common_pb2.Event],
    ) -> TurnFeed:
        feed = TurnFeed(session_id, base)
        self._feeds[session_id] = feed

        def add(event: common_pb2.Event, event_id: str) -> None:
            feed.add(sse_message(event_id, event.WhichOneof("payload") or "event", to_json(event)))

        async def finish_with(event: common_pb2.Event) -> None:
            # The last event carries the transcript position after the turn.
            try:
                position = await end_position()
            except Exception:  # noqa: BLE001 - the id is a convenience; the event is not
                position = base
            add(event, str(position))

        async def pump() -> None:
            ended = False
            try:
                async for event in _chain(first, rest):
                    if event.WhichOneof("payload") in ("run_finished", "error"):
                        await finish_with(event)
                        ended = True
                    else:
                        add(event, f"{base}.{len(feed.messages) + 1}")
                if not ended:
                    raise RuntimeError("the turn's stream ended without run_finished")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the stream must end with a reason
                if not ended:
                    await finish_with(on_failure(exc))
            finally:
                feed.finish()
                with contextlib.suppress(RuntimeError):  # the loop is closing
                    asyncio.get_running_loop().call_later(FEED_RETENTION_S, self._forget, feed)

        feed.task = asyncio.create_task(pump())
        self._tasks.add(feed.task)
        feed.task.add_done_callback(self._tasks.discard)
        return feed

    def _forget(self, feed: TurnFeed) -> None:
        if self._feeds.get(feed.session_id) is feed:
            del self._feeds[feed.session_id]

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for feed in self._feeds.values():
            feed.finish()
        self._feeds.clear()


async def _chain(first: common_pb2.Event, rest: AsyncIterator[common_pb2.Event]) -> AsyncIterator[common_pb2.Event]:
    yield first
    async for event in rest:
        yield event


def transcript_message(message: common_pb2.Message) -> bytes:
    return sse_message(str(message.seq), "message", to_json(message))


async def transcript_after(
    read_page: Callable[[int], Awaitable[sessions_pb2.GetTranscriptResponse]], after: int, until: int | None = None
) -> AsyncIterator[bytes]:
    """The transcript's messages with after < seq (<= until), as `message` events."""
    while True:
        page = await read_page(after)
        for message in page.messages:
            if until is not None and message.seq > until:
                return
            yield transcript_message(message)
        if not page.next_after_seq:
            return
        after = page.next_after_seq
