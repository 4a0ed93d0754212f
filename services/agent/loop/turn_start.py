"""A turn's start-up, before its first step: the reads and the one write every turn begins with.

    startup = TurnStartup(agent, request, emit)
    ... TurnContext(learning=startup.learning, usage_tag=startup.usage_tag, ...) ...
    started = await startup.run(user, capabilities, persist=..., writing=...)
    started.history, started.memories, startup.remote_tools

At the same time, so the turn waits for the slowest of them rather than their sum:

- **the turn's start in memory**: the transcript as it stands, the user's message durably
  appended after it, the memories recalled for it, and what the learning capabilities read
  (standing instructions, skills, promoted tools) — one StartTurn call (memory/turns.py); an
  agent built without a turn starter (a core under test) makes a read, an append and a search.
  A turn the gateway sent with its session to open (session_open.py) opens it in that same call
  and resolves its settings from the answer: `on_opened` tells the loop;
- **the tool catalog** of the turn's namespace, kept between turns while its version holds
  (tool_catalog.py), listed otherwise — after the turn's start when the turn opens its session
  (the namespace and its mcp_servers_version come from there);
- **every capability's `load`**, whose learning reads are served from what StartTurn brought
  (learning.py) instead of a call each.

It also makes the turn's usage tag (who its model calls are for, usage_log.py).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncContextManager, Awaitable, Callable, Sequence

from agentmesh.agent.loop import context
from agentmesh.agent.loop.ports import LearningAnswer, MemoryHit, NotSupported
from agentmesh.agent.loop.session_open import OpenedSession, resolve
from agentmesh.agent.loop.turn import Capability
from agentmesh.agent.loop.turn_request import TurnRequest, workspace_of
from agentmesh.agent.loop.usage_log import UsageTag
from agentmesh.agent.types import ChatMessage, RunEvent, StatusEvent, ToolSpec
from agentmesh.errors import AgentmeshError
from agentmesh.logs import get_logger

if TYPE_CHECKING:  # the loop imports this module
    from agentmesh.agent.loop.call_payloads import CallRecorder
    from agentmesh.agent.loop.run import Agent

log = get_logger("agentmesh.agent")

__all__ = ["Started", "TurnStartup"]


@dataclass(frozen=True)
class Started:
    stored: list[ChatMessage]  # the session's transcript before this turn, every entry as stored
    history: list[ChatMessage]  # what the model sees of it (summaries in place, repaired)
    memories: list[MemoryHit]  # recalled for the turn


class TurnStartup:
    def __init__(self, agent: "Agent", request: "TurnRequest", emit: Callable[[RunEvent], None], *,
                 on_opened: "Callable[[TurnRequest, OpenedSession | None], None] | None" = None):
        self._agent = agent
        self._request = request
        self._settings = agent.settings
        self._emit = emit
        # A turn that opens its session (session_open.py): told the resolved request once it is open.
        self._on_opened = on_opened
        self.usage_tag = UsageTag(agent.usage_log, request.session_id, request.run_id, request.namespace,
                                  workspace_of(request), agent.settings.memory_timeout_s, calls=self._recorder(request))
        # Where StartTurn's answer for the learning capabilities goes (None: they read it themselves).
        self._brought: LearningAnswer | None = None
        self._learning_parts: frozenset[str] = frozenset()
        self.learning = agent.learning
        if agent.learning is not None and agent.turn_start is not None and agent.learning.parts():
            self._learning_parts = agent.learning.parts()
            self.learning, self._brought = agent.learning.for_turn()
        # The tools service's catalog for this turn; known: listed (not an outage stand-in).
        self.remote_tools: list[ToolSpec] = []
        self.remote_catalog_known = False

    async def run(self, user: ChatMessage, capabilities: Sequence[Capability], *,
                  persist: Callable[[list[ChatMessage]], Awaitable[None]],
                  writing: Callable[[], AsyncContextManager[None]]) -> Started:
        """`persist` appends to the transcript; `writing` marks a write in flight (not a safe
        point for an interrupt, run.py)."""
        # The loads that do something (most capabilities have none), each in a task of its own:
        # those served from what `_begin` brings wait for it.
        loads = [capability.load() for capability in capabilities if type(capability).load is not Capability.load]
        loading = asyncio.gather(*loads) if loads else None
        try:
            if self._request.opening is not None:
                # A turn that opens its session learns its namespace and mcp_servers_version from
                # the opening: its catalog (kept between turns, so mostly no call) is looked up after.
                started = await self._begin(user, persist, writing)
                await self._list_tools()
            else:
                started, _ = await asyncio.gather(self._begin(user, persist, writing), self._list_tools())
            if loading is not None:
                await loading
        except BaseException:
            if loading is not None:
                loading.cancel()
            raise
        finally:
            self._answer_learning(None)  # whatever happened, no load waits forever
        return started

    def _answer_learning(self, learned: Any) -> None:
        if self._brought is not None:
            self._brought.answer(learned)

    # --- the turn's start in memory -----------------------------------------------------------

    async def _begin(self, user: ChatMessage, persist: Callable[[list[ChatMessage]], Awaitable[None]],
                     writing: Callable[[], AsyncContextManager[None]]) -> Started:
        """The history the turn starts from, with `user` persisted after it, and the recalled
        memories: in one call to memory where it offers one, else a read, an append and a search."""
        starter, memory, k = self._agent.turn_start, self._agent.memory, self._settings.recall_k
        request = self._request
        opening = request.opening
        if starter is not None:
            # Only what is asked for, so a starter that predates a part need not know of it.
            asked: dict[str, Any] = {"learning": self._learning_parts} if self._learning_parts else {}
            if opening is not None:
                asked["opening"] = opening
            try:
                async with writing():
                    begun = await starter.start(
                        request.session_id, [user], namespace=request.namespace, query=request.message,
                        k=k if memory is not None else 0, recall_timeout_s=self._settings.recall_timeout_s, **asked)
            except AgentmeshError as exc:
                if self._brought is not None:
                    self._brought.fail(exc.message)
                raise
            else:
                if opening is not None:
                    # A memory service that ignores `opening` (older than it) did not open it.
                    self._opened(begun.opened or await starter.open(request.session_id, request.namespace, opening))
                self._answer_learning(begun.learned)
                return Started(begun.stored, self._history_from(begun.stored),
                               self._recalled(begun.memories, begun.recall_error))
        if opening is not None:
            self._opened(await starter.open(request.session_id, request.namespace, opening)
                         if starter is not None else None)
            request = self._request

        async def history_then_user() -> list[ChatMessage]:
            stored = await self._agent.transcripts.load(request.session_id)
            await persist([user])  # after the read, so history holds only earlier turns
            return stored

        stored, memories = await asyncio.gather(history_then_user(), self._recall())
        return Started(stored, self._history_from(stored), memories)

    def _opened(self, opened: "OpenedSession | None") -> None:
        """The turn's session is open: resolve the turn's settings from it (None: nothing to
        resolve from, an agent without StartTurn: the turn's and the deployment's settings)."""
        request = self._request
        assert request.opening is not None
        self._request = resolve(request, opened or OpenedSession(request.namespace, False), self._agent.models)
        self.usage_tag.namespace = self._request.namespace
        # The session's own switch is known now, before the turn's first model call.
        self.usage_tag.calls = self._recorder(self._request)
        if self._on_opened is not None:
            self._on_opened(self._request, opened)

    def _recorder(self, request: TurnRequest) -> CallRecorder | None:
        """The recorder of the turn's model calls when the deployment or the session records them."""
        on = self._settings.record_model_calls or request.record_model_calls
        return self._agent.call_recorder if on else None

    def _history_from(self, stored: list[ChatMessage]) -> list[ChatMessage]:
        return context.repair(context.model_view(stored, use_summaries=self._settings.compaction))

    async def _recall(self) -> list[MemoryHit]:
        memory, k = self._agent.memory, self._settings.recall_k
        if memory is None or k == 0:
            return []
        try:
            async with asyncio.timeout(self._settings.recall_timeout_s):
                hits = await memory.search(self._request.namespace, self._request.message, k)
        except NotSupported:
            self._emit(StatusEvent("long-term memory is not available yet; continuing without recall"))
            return []
        except (AgentmeshError, TimeoutError) as exc:
            return self._recalled([], exc.message if isinstance(exc, AgentmeshError) else "it took too long")
        return self._recalled(hits, "")

    def _recalled(self, hits: list[MemoryHit], error: str) -> list[MemoryHit]:
        if error:
            log.warning("recall failed", error=error)
            self._emit(StatusEvent(f"could not recall memories ({error}); continuing without them"))
            return []
        if hits:  # "recalled 0 memories" on every turn would only be noise
            self._emit(StatusEvent(f"recalled {len(hits)} {'memory' if len(hits) == 1 else 'memories'}"))
        return hits

    # --- the tool catalog ---------------------------------------------------------------------

    async def _list_tools(self) -> None:
        namespace, mcp_version = self._request.namespace, self._request.mcp_servers_version
        try:
            catalog = self._agent.catalog
            self.remote_tools = await (catalog.tools(namespace, mcp_version) if catalog is not None
                                       else self._agent.tools.list_tools(namespace, mcp_version=mcp_version))
            self.remote_catalog_known = True
        except AgentmeshError as exc:
            log.warning("tool catalog unavailable", error=exc.message)
            self._emit(StatusEvent(f"the tools service is unavailable ({exc.message}); continuing without its tools"))
            self.remote_tools = []

