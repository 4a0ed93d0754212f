"""One supervised MCP connection per configured server: started at service start, restarted with
backoff when it dies, stopped when idle and started again by the next call.

The SDK's transports and ClientSession are anyio context managers, which must be entered and left
in one task; the supervisor task owns them and other tasks (Execute RPCs) send requests through
the session it publishes. How the transport is opened (a jailed stdio process, an HTTP endpoint
behind the egress policy) is the `Opener` port's business.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Callable, cast

import mcp.types as mcp_types
from mcp import ClientSession
from mcp.types import RequestParamsMeta

from agentmesh.logs import get_logger

log = get_logger("agentmesh.tools.mcp")

Opener = Callable[[], AbstractAsyncContextManager[tuple[Any, Any]]]
TIMED_OUT = "it did not answer in time"
NOT_STARTED = "not started"
STILL_STARTING = "it is still starting (an npx or uvx entry's first start installs its package)"
CLOSED = "Connection closed"  # the SDK's word for a stdio server's process that ended
SILENT_EXIT = ("its process ended before it answered, writing nothing to stderr: run its command by hand to see "
               "whether it is a stdio MCP server that starts without a terminal")


class ServerUnavailable(Exception):
    """The server cannot be reached now; the message says why (for the model and the operator)."""


@dataclass(frozen=True)
class SupervisorTimings:
    connect_timeout_s: float = 20.0
    # With no call for this long, the connection (and a stdio server's process) is stopped.
    idle_s: float = 300.0
    # How often a live connection is pinged to notice a dead server.
    ping_interval_s: float = 5.0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 60.0


class McpServerConnection:
    def __init__(self, name: str, opener: Opener, timings: SupervisorTimings,
                 last_words: Callable[[], str] | None = None):
        """`last_words`: why the server's process ended before it answered, in a sentence with
        the fix, from what it wrote to stderr (a stdio server); None where there is no such process."""
        self.name = name
        self._opener = opener
        self._last_words = last_words
        self._timings = timings
        self.tools: list[mcp_types.Tool] = []
        self.error = NOT_STARTED
        self.restarts = 0
        self._session: ClientSession | None = None
        self._connected = asyncio.Event()
        self._attempted = asyncio.Event()  # one connection attempt ended (either way)
        self._wake = asyncio.Event()  # idle-stopped and a call wants the server back
        self._poke = asyncio.Event()  # something for the watch loop: a catalog change or close
        self._needs_refresh = False
        self._broken = False
        self._closing = False
        self._in_flight = 0
        self._last_used = time.monotonic()
        self._idle = False
        self._connecting = False
        self._task: asyncio.Task[None] | None = None
        self.on_tools_changed: Callable[[], None] = lambda: None

    @property
    def available(self) -> bool:
        return self._session is not None or self._idle

    async def start(self) -> None:
        """Start the supervisor and wait for the first attempt (success or failure) to end."""
        self._task = asyncio.create_task(self._supervise(), name=f"mcp:{self.name}")
        try:
            await asyncio.wait_for(self._attempted.wait(), self._timings.connect_timeout_s + 5)
        except TimeoutError:
            # Still opening (an npx/uvx entry's first start installs its package first, fetch.py):
            # the service starts meanwhile, and a call waits for the connection within its time.
            if self.error == NOT_STARTED:
                self.error = STILL_STARTING

    async def close(self) -> None:
        self._closing = True
        self._poke.set()
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - shutting down
                pass

    async def call(self, tool: str, arguments: dict[str, Any], timeout_s: float,
                   meta: dict[str, Any] | None = None) -> mcp_types.CallToolResult:
        self._in_flight += 1
        self._last_used = time.monotonic()
        try:
            session = await self._live_session(timeout_s)
            return await session.call_tool(tool, arguments, read_timeout_seconds=timeout_s,
                                           meta=cast("RequestParamsMeta | None", meta))
        finally:
            self._in_flight -= 1
            self._last_used = time.monotonic()

    def lost(self) -> None:
        """A call found the connection closed: restart now rather than at the next ping."""
        self._broken = True
        self._poke.set()

    async def _live_session(self, timeout_s: float) -> ClientSession:
        if self._idle:
            self._wake.set()
        if self._session is None and (self._idle or self._connecting):
            # Stopped while idle, or (re)starting right now: worth waiting for, within the call's time.
            try:
                await asyncio.wait_for(self._connected.wait(), min(timeout_s, self._timings.connect_timeout_s))
            except TimeoutError:
                pass
        if self._session is None:
            raise ServerUnavailable(f"MCP server {self.name!r} is unavailable: {self.error}")
        return self._session

    async def _supervise(self) -> None:
        backoff = self._timings.backoff_initial_s
        while not self._closing:
            started = time.monotonic()
            try:
                await self._connect_once()
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # noqa: BLE001 - a dead server is a state, not a crash
                self.error = describe(exc)
                started = self._session is not None or self.error == TIMED_OUT  # a hung server did not end
                said = self._last_words() if self._last_words is not None and not started else ""
                if said:
                    # It ended before it answered: the SDK's "Connection closed" says nothing, the
                    # process's own last lines say why (a crash of a server that had been
                    # answering keeps the SDK's sentence: its last line is likely just logging).
                    self.error = said
                elif self._last_words is not None and not started and self.error == CLOSED:
                    self.error = SILENT_EXIT
                log.warning("MCP server unavailable", server=self.name, error=self.error)
            finally:
                self._session = None
                self._connected.clear()
                self._attempted.set()
            if self._closing:
                return
            if self._idle:
                log.info("MCP server stopped while idle", server=self.name)
                await self._wake.wait()
                self._wake.clear()
                self._idle = False
                backoff = self._timings.backoff_initial_s
                continue
            if time.monotonic() - started > 4 * backoff:
                backoff = self._timings.backoff_initial_s  # it ran a while: a fresh failure
            self.restarts += 1
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self._timings.backoff_max_s)

    async def _connect_once(self) -> None:
        self._connecting = True
        try:
            await self._connect_and_watch()
        finally:
            self._connecting = False

    async def _connect_and_watch(self) -> None:
        async with self._opener() as (read, write):
            async with ClientSession(read, write, message_handler=self._on_message) as session:
                with_timeout = asyncio.timeout(self._timings.connect_timeout_s)
                async with with_timeout:
                    await session.initialize()
                    await self._refresh(session)
                self._session = session
                self._connecting = False
                self.error = ""
                self._connected.set()
                self._attempted.set()
                log.info("MCP server connected", server=self.name, tools=len(self.tools))
                await self._watch(session)

    async def _watch(self, session: ClientSession) -> None:
        """Until close or idle: ping now and then (a dead server raises), re-list on list_changed."""
        while not self._closing:
            try:
                await asyncio.wait_for(self._poke.wait(), self._timings.ping_interval_s)
            except TimeoutError:
                pass
            self._poke.clear()
            if self._closing:
                return
            if self._broken:
                self._broken = False
                raise ConnectionError("the connection closed")
            if self._needs_refresh:
                self._needs_refresh = False
                await self._refresh(session)
            idle_for = time.monotonic() - self._last_used
            if not self._in_flight and idle_for > self._timings.idle_s:
                self._idle = True
                # From now on a call waits for the restart rather than using a session that is closing.
                self._session = None
                self._connected.clear()
                return
            async with asyncio.timeout(self._timings.connect_timeout_s):
                await session.send_ping()

    async def _refresh(self, session: ClientSession) -> None:
        tools: list[mcp_types.Tool] = []
        cursor = None
        while True:
            params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
            listing = await session.list_tools(params=params)
            tools.extend(listing.tools)
            cursor = listing.next_cursor
            if not cursor:
                break
        self.tools = tools
        self.on_tools_changed()

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, mcp_types.ToolListChangedNotification):
            self._needs_refresh = True
            self._poke.set()


def describe(exc: BaseException) -> str:
    """A sentence from what the SDK raised, looking inside task-group exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return TIMED_OUT
    text = str(exc) or type(exc).__name__
    return text
