"""The agent loop: one turn of one session, as a small explicit object.

    agent = Agent(provider, tools, transcripts, memory, settings, model="llama3.1", telemetry=t)
    run = agent.start(TurnRequest(session_id="s1", run_id="r1", message="hi"))
    async for event in run.events():   # RunStarted … TextDelta/ToolCall/ToolResult/Status … RunFinished|RunError
        ...
    run.cancel()                       # from anywhere: the stream ends with RunFinished("cancelled")
    run.decide(call_id, approved, note)  # answer an ApprovalRequestEvent (see approvals.py)

The turn runs in a task of its own and hands events over through a queue, so the consumer
going away (a cancelled RPC) cancels exactly that task, and spans are opened and closed in
one task (OpenTelemetry contexts must not hop across async generators).

Each step is persisted as soon as it happens: the user message before the first model call,
each assistant message with its tool calls, each tool result as it arrives. A crash mid-turn
loses nothing already done; `context.repair` fills in results a crash or cancel lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from dataclasses import dataclass
from typing import AsyncIterator, Callable, cast

import structlog
from opentelemetry.trace import SpanKind, Status, StatusCode

from agentmesh.agent import compaction, context, deep, subagents
from agentmesh.agent.approvals import ApprovalGate
from agentmesh.agent.memory_tools import MemoryTools
from agentmesh.agent.model_call import traced_model_call
from agentmesh.agent.ports import LongTermMemory, MemoryHit, NotSupported, ToolRunner, TranscriptStore
from agentmesh.agent.providers.base import ModelProvider
from agentmesh.agent.settings import AgentSettings
from agentmesh.agent.types import (
    ApprovalRequestEvent,
    ApprovalResolvedEvent,
    ChatMessage,
    ModelReply,
    ModelRequest,
    RunErrorEvent,
    RunEvent,
    RunFinishedEvent,
    RunStartedEvent,
    StatusEvent,
    ToolCall,
    ToolCallEvent,
    ToolOutcome,
    ToolResultEvent,
    ToolSpec,
    Usage,
    tool_message,
)
from agentmesh.errors import AgentmeshError
from agentmesh.logs import get_logger
from agentmesh.telemetry import Telemetry
from agentmesh.telemetry.genai import (
    ERROR_TYPE,
    GEN_AI_TOOL_CALL_ID,
    GEN_AI_TOOL_NAME,
    execute_tool_span,
    invoke_agent_span,
    set_usage,
)

log = get_logger("agentmesh.agent")

_END = object()


@dataclass(frozen=True)
class TurnRequest:
    session_id: str
    run_id: str
    message: str
    namespace: str = "default"
    max_iterations: int = 0  # 0: the configured default
    model: str = ""  # "": the configured model
    system_prompt: str = ""  # "": the configured prompt
    # Tools that need approval in this turn on top of the configured ones.
    approval_tools: frozenset[str] = frozenset()
    mode: str = ""  # "" | "default" | "deep" (deep.py)
    subagent: subagents.SubagentLink | None = None  # set on a sub-agent's turn (subagents.py)


class Agent:
    """Everything a turn needs, shared by all turns of this service."""

    def __init__(
        self,
        provider: ModelProvider,
        tools: ToolRunner,
        transcripts: TranscriptStore,
        memory: LongTermMemory | None,
        settings: AgentSettings,
        *,
        model: str,
        telemetry: Telemetry,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        sessions: subagents.ChildSessions | None = None,
    ):
        self.provider = provider
        self.tools = tools
        self.transcripts = transcripts
        self.memory = memory
        self.memory_tools = MemoryTools(memory) if memory is not None else None
        self.settings = settings
        self.model = model
        self.telemetry = telemetry
        self.clock = clock
        self.sessions = sessions  # creates sub-agents' sessions; None: the transcript store needs none

    def start(self, request: TurnRequest) -> "TurnRun":
        return TurnRun(self, request)


class TurnRun:
    def __init__(self, agent: Agent, request: TurnRequest):
        self.agent = agent
        self.request = request
        self.settings = agent.settings
        self.model = request.model or agent.model
        self.max_iterations = deep.step_budget(request, agent.settings)
        self.usage = Usage()
        self.iterations = 0
        self.trace_id = ""
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._catalog: dict[str, ToolSpec] = {}
        self._remote_catalog_known = False
        self.approvals = ApprovalGate(agent.settings.approval_tools | request.approval_tools,
                                      agent.settings.approval_timeout_s)
        self.delegation = subagents.Delegation(self) if subagents.offered(request, agent.settings) else None

    # --- the consumer's side ------------------------------------------------------------------

    async def events(self) -> AsyncIterator[RunEvent]:
        """Start the turn and stream its events; leaving early (or being cancelled) cancels it."""
        self._task = asyncio.create_task(self._run(), name=f"turn-{self.request.run_id}")
        try:
            while True:
                event = await self._queue.get()
                if event is _END:
                    return
                yield cast(RunEvent, event)
        finally:
            if not self._task.done():
                self._task.cancel()
                # Let the turn persist what it must before the RPC is torn down.
                await asyncio.wait([self._task], timeout=self.settings.memory_timeout_s)

    def cancel(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()

    def decide(self, call_id: str, approved: bool, note: str = "") -> bool:
        """A person's decision on a held call; False when no call with that id is waiting."""
        return self.approvals.decide(call_id, approved, note)

    def _emit(self, event: RunEvent) -> None:
        self._queue.put_nowait(event)

    # --- the turn -----------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._traced_turn()
        finally:
            self._queue.put_nowait(_END)  # whatever happened, the stream ends

    async def _traced_turn(self) -> None:
        req = self.request
        tracer = self.agent.telemetry.tracer
        attributes = {"agentmesh.session_id": req.session_id, "agentmesh.run_id": req.run_id,
                      **subagents.span_attributes(req)}
        with structlog.contextvars.bound_contextvars(session_id=req.session_id, run_id=req.run_id), \
                self.agent.telemetry.metrics.turn_in_flight(), \
                invoke_agent_span(tracer, agent_name=subagents.agent_name(self.settings.name, req),
                                  conversation_id=req.session_id, model=self.model,
                                  provider=self.agent.provider.name, attributes=attributes) as span:
            context_of = span.get_span_context()
            self.trace_id = format(context_of.trace_id, "032x") if context_of.is_valid else ""
            self._emit(RunStartedEvent(trace_id=self.trace_id))
            started = time.monotonic()
            try:
                stop_reason, final_text = await self._turn()
            except asyncio.CancelledError:
                stop_reason, final_text = "cancelled", ""
                span.set_status(Status(StatusCode.ERROR, "cancelled"))
                span.set_attribute(ERROR_TYPE, "cancelled")
            except AgentmeshError as exc:
                log.warning("turn failed", code=exc.code, error=exc.message)
                span.set_status(Status(StatusCode.ERROR, exc.message))
                span.set_attribute(ERROR_TYPE, exc.code)
                self._emit(RunErrorEvent(code=exc.code, message=exc.message))
                return
            except Exception as exc:  # a bug must end the turn with a clear event
                log.exception("turn crashed")
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                self._emit(RunErrorEvent(code="INTERNAL", message=f"the agent failed: {type(exc).__name__}: {exc}"))
                return
            set_usage(span, input_tokens=self.usage.input_tokens, output_tokens=self.usage.output_tokens)
            span.set_attributes({
                "agentmesh.iterations": self.iterations,
                "agentmesh.stop_reason": stop_reason,
            })
            log.info("turn finished", stop_reason=stop_reason, iterations=self.iterations,
                     seconds=round(time.monotonic() - started, 3))
            self._emit(RunFinishedEvent(usage=self.usage, iterations=self.iterations, final_text=final_text,
                                        trace_id=self.trace_id, stop_reason=stop_reason))

    async def _turn(self) -> tuple[str, str]:
        req = self.request
        user = ChatMessage(role="user", content=req.message, run_id=req.run_id)

        async def history_then_user() -> list[ChatMessage]:
            history = await self._load_history()
            await self._persist([user])  # after the read, so history holds only earlier turns
            return history

        history, tool_specs, memories = await asyncio.gather(history_then_user(), self._list_tools(), self._recall())
        history = await compaction.compact_history(self.agent, req, model=self.model, history=history,
                                                   usage=self.usage, emit=self._emit)
        turn: list[ChatMessage] = [user]
        work = deep.work_for(self, history, tool_specs, memories)  # deep mode: plan, reflection, progress
        await work.start(turn)
        for step in range(1, self.max_iterations + 1):
            await work.before_step(step, turn)
            reply = await self._call_model(history, work.view(turn), tool_specs, memories, allow_tools=True)
            assistant = ChatMessage(role="assistant", content=reply.text, tool_calls=reply.tool_calls, run_id=req.run_id)
            await self._persist([assistant])
            turn.append(assistant)
            if not reply.tool_calls:
                return "completed", reply.text
            turn.extend(await self._run_tools(reply.tool_calls))
        # Out of steps: one last call without tools, so the user gets an answer, not silence.
        self._emit(StatusEvent(f"reached the limit of {self.max_iterations} steps; asking the model for a summary"))
        note = ChatMessage(role="system", content=context.SUMMARY_INSTRUCTION.format(n=self.max_iterations))
        reply = await self._call_model(history, [*work.view(turn), note], tool_specs, memories, allow_tools=False)
        await self._persist([ChatMessage(role="assistant", content=reply.text, run_id=req.run_id)])
        return "max_iterations", reply.text

    # --- context ------------------------------------------------------------------------------

    async def _load_history(self) -> list[ChatMessage]:
        stored = await self.agent.transcripts.load(self.request.session_id)
        return context.repair(compaction.model_view(stored, use_summaries=self.settings.compaction))

    async def _list_tools(self) -> list[ToolSpec]:
        own = list(self.agent.memory_tools.specs) if self.agent.memory_tools else []
        if self.delegation is not None:
            own.append(self.delegation.spec)
        try:
            remote = await self.agent.tools.list_tools()
            self._remote_catalog_known = True
        except AgentmeshError as exc:
            log.warning("tool catalog unavailable", error=exc.message)
            self._emit(StatusEvent(f"the tools service is unavailable ({exc.message}); continuing without its tools"))
            remote = []
        own_names = {s.name for s in own}
        specs = [s for s in remote if s.name not in own_names] + own
        self._catalog = {s.name: s for s in specs}
        return specs

    async def _recall(self) -> list[MemoryHit]:
        memory, k = self.agent.memory, self.settings.recall_k
        if memory is None or k == 0:
            return []
        try:
            async with asyncio.timeout(self.settings.recall_timeout_s):
                hits = await memory.search(self.request.namespace, self.request.message, k)
        except NotSupported:
            self._emit(StatusEvent("long-term memory is not available yet; continuing without recall"))
            return []
        except (AgentmeshError, TimeoutError) as exc:
            reason = exc.message if isinstance(exc, AgentmeshError) else "it took too long"
            log.warning("recall failed", error=reason)
            self._emit(StatusEvent(f"could not recall memories ({reason}); continuing without them"))
            return []
        if hits:  # "recalled 0 memories" on every turn would only be noise
            self._emit(StatusEvent(f"recalled {len(hits)} {'memory' if len(hits) == 1 else 'memories'}"))
        return hits

    async def _persist(self, messages: list[ChatMessage]) -> None:
        await self.agent.transcripts.append(self.request.session_id, messages)

    # --- model calls --------------------------------------------------------------------------

    async def _call_model(
        self,
        history: list[ChatMessage],
        turn: list[ChatMessage],
        tools: list[ToolSpec],
        memories: list[MemoryHit],
        *,
        allow_tools: bool,
    ) -> ModelReply:
        s = self.settings
        base = self.request.system_prompt or s.system_prompt
        probe = context.system_prompt(base, now=self.agent.clock(), tools=tools, memories=memories)
        kept, current, omitted = context.fit(
            probe, history, turn, budget_chars=s.context_budget_chars, tool_output_chars=s.tool_output_chars
        )
        system = context.system_prompt(base, now=self.agent.clock(), tools=tools, memories=memories, omitted=omitted)
        request = ModelRequest(
            model=self.model,
            messages=[ChatMessage(role="system", content=system), *kept, *current],
            tools=tools,
            allow_tools=allow_tools,
            max_tokens=s.max_tokens,
        )
        self.iterations += 1
        return await traced_model_call(self.agent.provider, self.agent.telemetry, request,
                                       usage=self.usage, emit=self._emit)

    # --- tool calls ---------------------------------------------------------------------------

    async def _run_tools(self, calls: tuple[ToolCall, ...]) -> list[ChatMessage]:
        """Run one reply's calls concurrently; results stream out as they finish, are persisted
        as they finish, and go back to the model in call order."""
        for call in calls:
            self._emit(ToolCallEvent(call))
        limit = asyncio.Semaphore(self.settings.tool_concurrency)
        cap = self.settings.max_tool_calls
        tasks = [
            asyncio.create_task(self._gated(call, limit) if i < cap else self._refuse(call, cap))
            for i, call in enumerate(calls)
        ]
        saved: set[str] = set()
        try:
            for finished in asyncio.as_completed(tasks):
                outcome = await finished
                self._emit(ToolResultEvent(outcome))
                await self._persist([tool_message(outcome, self.request.run_id)])
                saved.add(outcome.call_id)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            # Close the step in the transcript: every call gets a result, so the next turn replays cleanly.
            lost = [
                ToolOutcome.error(call, "cancelled", "error: the run was cancelled before this call finished")
                for call, task in zip(calls, tasks, strict=True)
                if call.call_id not in saved
            ]
            if lost:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(
                        self._persist([tool_message(o, self.request.run_id) for o in lost]), self.settings.memory_timeout_s
                    )
            raise
        return [tool_message(task.result(), self.request.run_id) for task in tasks]

    async def _gated(self, call: ToolCall, limit: asyncio.Semaphore) -> ToolOutcome:
        """Run the call, first holding it for a person's decision when the policy says so. The
        wait holds no concurrency slot, so the reply's other calls run meanwhile."""
        if self.approvals.needs_approval(call):
            attributes = {GEN_AI_TOOL_NAME: call.name, GEN_AI_TOOL_CALL_ID: call.call_id}
            # A span of its own, so a trace shows the time spent waiting for a person.
            with self.agent.telemetry.tracer.start_as_current_span(
                f"await_approval {call.name}", kind=SpanKind.INTERNAL, attributes=attributes,
            ) as span:
                # No await between the event and wait() registering the call: a decision cannot
                # arrive before the call is known to be waiting.
                self._emit(ApprovalRequestEvent(call, self.approvals.timeout_s))
                log.info("tool call waiting for approval", tool=call.name, call_id=call.call_id)
                decision = await self.approvals.wait(call)
                span.set_attributes({"agentmesh.approval.approved": decision.approved,
                                     "agentmesh.approval.decided_by": decision.decided_by})
            log.info("tool call decided", tool=call.name, call_id=call.call_id, approved=decision.approved,
                     decided_by=decision.decided_by)
            self._emit(ApprovalResolvedEvent(call, decision.approved, decision.note, decision.decided_by))
            if not decision.approved:
                return self.approvals.denial(call, decision)
        return await self._execute(call, limit)

    @staticmethod
    async def _refuse(call: ToolCall, cap: int) -> ToolOutcome:
        return ToolOutcome.error(
            call, "too_many_calls", f"error: not run: at most {cap} tool calls per reply; make fewer calls at a time"
        )

    async def _execute(self, call: ToolCall, limit: asyncio.Semaphore) -> ToolOutcome:
        async with limit:
            with execute_tool_span(self.agent.telemetry.tracer, name=call.name, call_id=call.call_id) as span, \
                    self.agent.telemetry.metrics.tool_timer(call.name) as timer:
                started = time.monotonic()
                try:
                    outcome = await self._dispatch(call)
                except asyncio.CancelledError:
                    span.set_status(Status(StatusCode.ERROR, "cancelled"))
                    span.set_attribute(ERROR_TYPE, "cancelled")
                    raise
                except Exception as exc:  # a tool must never crash the turn
                    log.exception("tool call failed inside the agent", tool=call.name)
                    outcome = ToolOutcome.error(call, "internal", f"error: {call.name} failed inside the agent: {exc}")
                outcome.call_id, outcome.name = call.call_id, call.name
                if not outcome.duration_ms:
                    outcome.duration_ms = (time.monotonic() - started) * 1000
                if outcome.is_error:
                    kind = outcome.error_kind or "error"
                    span.set_status(Status(StatusCode.ERROR, kind))
                    span.set_attribute(ERROR_TYPE, kind)
                    timer.outcome = kind if kind in ("timeout", "cancelled") else "error"
                return outcome

    async def _dispatch(self, call: ToolCall) -> ToolOutcome:
        own = self.agent.memory_tools
        if own is not None and call.name in own.names:
            return await own.execute(call, self.request.namespace, self.request.session_id)
        if self.delegation is not None and call.name == subagents.DELEGATE_TASK:
            return await self.delegation.run(call)
        if self._remote_catalog_known and call.name not in self._catalog:
            available = ", ".join(sorted(self._catalog)) or "none"
            return ToolOutcome.error(call, "not_found", f"error: there is no tool named {call.name!r}; available: {available}")
        # A sub-agent's tools work in its root session's workspace, so files are shared.
        return await self.agent.tools.execute(subagents.workspace_of(self.request), call)
