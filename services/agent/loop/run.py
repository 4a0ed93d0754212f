"""The agent loop: one turn of one session, as a small explicit object.

    agent = Agent(provider, tools, transcripts, memory, settings, model="llama3.1", telemetry=t)
    run = agent.start(TurnRequest(session_id="s1", run_id="r1", message="hi"))
    async for event in run.events():   # RunStarted … TextDelta/ToolCall/ToolResult/Status … RunFinished|RunError
        ...
    run.cancel()                       # from anywhere: the stream ends with RunFinished("cancelled")
    run.interrupt("interrupted")       # a newer message takes over: RunFinished("interrupted")
    run.decide(call_id, approved, note)  # answer an ApprovalRequestEvent (see approvals.py)

The turn runs in a task of its own and hands events over through a queue, so the consumer
going away (a cancelled RPC) cancels exactly that task, and spans are opened and closed in
one task (OpenTelemetry contexts must not hop across async generators).

Each step is persisted as soon as it happens: the user message before the first model call,
each assistant message with its tool calls, each tool result as it arrives — and shown only once
its append is acknowledged. A crash mid-turn loses nothing already done; `context.repair` fills
in results a crash or cancel lost. A step's last tool results are saved beside the next model
call rather than before it (show_after_save.py): nothing that follows them, the call's reply
included, is shown, persisted or acted on until their append is acknowledged.

What plugs into a turn (deep work, compaction, sub-agents, the memory tools, …) is a capability
(turn.py): the loop builds a `TurnContext`, asks `capabilities.for_turn` which capabilities apply,
and calls their hooks at fixed points. The turn's state lives here and nowhere else; what it
reads before its first step — transcript, recall, catalog, the capabilities' `load` — is
turn_start.py's; how a model call is made (prompt, fallback, continuation) is turn_model.py's,
and what a turn is asked, turn_request.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import time
from typing import Any, AsyncIterator, Callable, cast

import structlog
from opentelemetry.trace import Status, StatusCode

from agentmesh.agent.loop import context, tool_access
from agentmesh.agent.loop.approvals import ApprovalGate
from agentmesh.agent.loop.call_payloads import CallRecorder
from agentmesh.agent.loop.images import store_given
from agentmesh.agent.loop.model_choice import ModelChoice, NamedModel
from agentmesh.agent.loop.ports import (
    BackgroundCommands,
    ChildSessions,
    ImageFiles,
    ListedCatalog,
    LongTermMemory,
    NamedAgents,
    NamespaceModels,
    ToolRunner,
    TranscriptStore,
    TurnLearning,
    TurnStarter,
)
from agentmesh.agent.loop.session_open import OpenedSession
from agentmesh.agent.loop.show_after_save import ShowAfterSave
from agentmesh.agent.loop.tool_calls import ToolCalls
from agentmesh.agent.loop.turn import Capability, Nudge, Stop, TurnContext, Verdict
from agentmesh.agent.loop.turn_model import TurnModel
from agentmesh.agent.loop.turn_request import TurnRequest, agent_name, span_attributes, step_budget, workspace_of
from agentmesh.agent.loop.turn_start import TurnStartup
from agentmesh.agent.loop.usage_log import UsageLog
from agentmesh.agent.loop.window import Calibration
from agentmesh.agent.providers.base import ModelProvider
from agentmesh.agent.settings import AgentSettings
from agentmesh.agent.types import (
    ChatMessage,
    ModelReply,
    RunErrorEvent,
    RunEvent,
    RunFinishedEvent,
    RunStartedEvent,
    StatusEvent,
    ToolCall,
    ToolOutcome,
    ToolResultEvent,
    ToolSpec,
    Usage,
)
from agentmesh.errors import AgentmeshError
from agentmesh.logs import get_logger
from agentmesh.models import DEFAULT_MODEL
from agentmesh.telemetry import Telemetry
from agentmesh.telemetry.genai import (
    ERROR_TYPE,
    GEN_AI_REQUEST_MODEL,
    invoke_agent_span,
    set_usage,
)

__all__ = ["Agent", "TurnRequest", "TurnRun"]  # TurnRequest: turn_request.py

log = get_logger("agentmesh.agent")

_END = object()

# Which capabilities a turn gets, in the order their hooks run (capabilities/registry.py).
CapabilitiesFor = Callable[[TurnContext], list[Capability]]


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
        capabilities: CapabilitiesFor,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        sessions: ChildSessions | None = None,
        background: BackgroundCommands | None = None,
        models: dict[str, NamedModel] | None = None,
        usage_log: UsageLog | None = None,
        turn_start: TurnStarter | None = None,
        learning: TurnLearning | None = None,
        catalog: ListedCatalog | None = None,
        context_window: int = 0,
        compaction_model: str = "",
        images: ImageFiles | None = None,
        default_vision: bool = True,
        agents: NamedAgents | None = None,
        call_recorder: CallRecorder | None = None,
        namespace_models: NamespaceModels | None = None,
    ):
        self.provider = provider
        self.tools = tools
        self.transcripts = transcripts
        self.memory = memory
        self.settings = settings
        self.model = model
        self.telemetry = telemetry
        # Which capabilities a turn gets (capabilities/registry.py's `for_turn`, wired by the server).
        self.capabilities = capabilities
        self.clock = clock
        self.agents = agents  # the namespace's named agents, for delegation by name; None: not offered
        self.sessions = sessions  # creates sub-agents' sessions; None: the transcript store needs none
        self.background = background  # the tools service's background commands; None: not offered
        self.learning = learning  # standing instructions (learning.py); None: not offered
        # The transcript read, the user's message, recall and the learning reads in one call;
        # None: a call each.
        self.turn_start = turn_start
        # The tools service's catalog kept between turns (tool_catalog.py); None: listed per turn.
        self.catalog = catalog
        # The catalogue's models by name (model_choice.py); "default" is `provider` and `model`.
        # `context_window`: the default model's (AGENTMESH_LLM_CONTEXT_WINDOW); 0: unknown.
        self.models = {DEFAULT_MODEL: NamedModel(DEFAULT_MODEL, provider, model, context_window=context_window,
                                                 vision=default_vision),
                       **(models or {})}
        # Builds the namespaces' own models (ModelConfig resources); None: only the catalogue's.
        self.namespace_models = namespace_models
        # The catalogue model that writes summaries (AGENTMESH_COMPACTION_MODEL); "": the turn's.
        self.compaction_model = compaction_model
        # Characters per token, learned per model from the usage replies report (window.py).
        self.calibration = Calibration()
        # The session workspace's stored images (loop/images.py); None: images are described, not shown.
        self.images = images
        self.usage_log = usage_log  # the usage ledger (usage_log.py); None: calls are not recorded
        self.call_recorder = call_recorder  # each call's payloads (call_payloads.py), for the turns that record; None: none can

    def models_for(self, request: TurnRequest) -> dict[str, NamedModel]:
        """The models `request` may use: the catalogue's, and its namespace's own that it names
        (the turn's model and its fallbacks; a catalogue name is never shadowed)."""
        models = dict(self.models)
        if self.namespace_models is None or not request.namespace_models:
            return models
        own = {m.name: m for m in request.namespace_models if m.name not in self.models}
        name = request.model
        while name in own and name not in models:
            models[name] = self.namespace_models.named(own[name])
            name = own[name].fallback
        return models

    def start(self, request: TurnRequest, *, approvals: ApprovalGate | None = None) -> "TurnRun":
        """A turn, not yet running (`events()` runs it). `approvals`: a gate to share (a
        sub-agent's turn shares its parent's); by default the turn gets its own."""
        return TurnRun(self, request, approvals=approvals)


class TurnRun:
    def __init__(self, agent: Agent, request: TurnRequest, *, approvals: ApprovalGate | None = None):
        self.agent = agent
        self.request = request
        self.settings = agent.settings
        # A sub-agent's request already names its namespace's models; a new turn's are read at opening.
        models = ModelChoice(agent.models_for(request), request.model)
        self.max_iterations = step_budget(request, agent.settings)
        self.usage = Usage()
        self.trace_id = ""
        self.approvals = approvals or ApprovalGate(agent.settings.approval_tools | request.approval_tools,
                                                   agent.settings.approval_timeout_s, request.permission_mode)
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._interrupted_as = ""  # the stop_reason a newer message asked for (interrupt())
        self._interrupt_delivered = False
        self._persisting = 0  # writes in flight: an interrupt waits for them (a safe point)
        self._unanswered: tuple[ToolCall, ...] = ()  # calls of the persisted reply not yet run
        # A step's last tool results, saved beside the next model call, and the events withheld
        # until they are: none is shown before the results are (show_after_save.py).
        self._shown: ShowAfterSave[RunEvent] = ShowAfterSave(self._show)
        self._catalog: dict[str, ToolSpec] = {}
        # A turn that opens its session announces itself once the session is open (its
        # run_started says the namespace): events before that wait for it.
        self._held: list[RunEvent] | None = [] if request.opening is not None else None
        self._span: Any = None
        # The reads and the write every turn starts with (turn_start.py).
        self._startup = TurnStartup(agent, request, self._emit, on_opened=self._opened)
        self._usage_tag = self._startup.usage_tag
        self._ctx = TurnContext(
            request=request, settings=self.settings, agent=agent, model=models.current.model, usage=self.usage,
            usage_tag=self._usage_tag, learning=self._startup.learning,
            step_budget=self.max_iterations, approvals=self.approvals, emit=self._emit,
            call_model=self._call_model, persist=self._persist, inject=self._inject,
            start_child=lambda child: agent.start(child, approvals=self.approvals),
        )
        self._capabilities: list[Capability] = agent.capabilities(self._ctx)
        self._model = TurnModel(self._ctx, self._capabilities, models, self._shown)
        self._ctx.budget, self._ctx.measure = self._model.budget, self._model.measure
        self._ctx.current_model = lambda: self._model.models.current
        self._tool_owners: dict[str, Capability] = {}
        self._turn_messages: list[ChatMessage] = []
        self._tool_calls = ToolCalls(run_id=request.run_id, settings=self.settings, telemetry=agent.telemetry,
                                     approvals=self.approvals, emit=self._emit, persist=self._persist,
                                     dispatch=self._dispatch, screen=self._screen, read_only=self._read_only)

    @property
    def model(self) -> str:
        return self._ctx.model

    @property
    def iterations(self) -> int:
        return self._model.calls

    # --- the consumer's side ------------------------------------------------------------------

    async def events(self) -> AsyncIterator[RunEvent]:
        """Start the turn and stream its events; leaving early (or being cancelled) cancels it."""
        self._task = asyncio.create_task(self._run(), name=f"turn-{self.request.run_id}")
        if self._interrupted_as:
            # After the task's first step, so it is inside its try blocks when the cancel lands.
            # A write then in flight delivers it when done (_persist).
            asyncio.get_running_loop().call_soon(lambda: None if self._persisting else self._deliver_interrupt())
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

    def interrupt(self, stop_reason: str) -> None:
        """Stop the turn because a newer message takes over. Steps already persisted stay, a
        reply still streaming is dropped, started tool calls are stopped and get a recorded
        result (tool_calls.py), and the stream ends with RunFinished(`stop_reason`)."""
        self._interrupted_as = self._interrupted_as or stop_reason
        if not self._persisting:
            self._deliver_interrupt()

    def _deliver_interrupt(self) -> None:
        if self._task is None:
            return  # not started yet: events() delivers it once the turn runs
        if not self._interrupt_delivered:
            self._interrupt_delivered = True
            self.cancel()

    def decide(self, call_id: str, approved: bool, note: str = "", rest_of_turn: bool = False,
               arguments_json: str = "") -> bool:
        """A person's decision on a held call; False when no call with that id is waiting."""
        return self.approvals.decide(call_id, approved, note, rest_of_turn, arguments_json)

    def _emit(self, event: RunEvent) -> None:
        self._shown.emit(event)  # withheld after results not yet saved

    def _show(self, event: RunEvent) -> None:
        if self._held is not None:
            if isinstance(event, RunErrorEvent):
                # The session could not be opened: the turn did not start, and the error alone
                # says so (the gateway answers the client with its status).
                self._held = None
            elif isinstance(event, RunFinishedEvent):  # stopped before it opened (cancelled)
                held, self._held = self._held, None
                for waiting in held:
                    self._queue.put_nowait(waiting)
            else:
                self._held.append(event)
                return
        self._queue.put_nowait(event)

    def _opened(self, resolved: TurnRequest, opened: OpenedSession | None) -> None:
        """The session is open (turn_start.py): the turn runs with its settings from here on."""
        self.request = self._ctx.request = resolved
        self._model.choose(ModelChoice(self.agent.models_for(resolved), resolved.model))
        self.approvals.mode = resolved.permission_mode or self.approvals.mode
        if self._span is not None:
            self._span.set_attribute(GEN_AI_REQUEST_MODEL, self.model)
        held, self._held = self._held or [], None
        self._emit(RunStartedEvent(trace_id=self.trace_id, namespace=resolved.namespace,
                                   session_created=opened is not None and opened.created))
        for event in held:
            self._emit(event)

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
                      **span_attributes(req)}
        with structlog.contextvars.bound_contextvars(session_id=req.session_id, run_id=req.run_id), \
                self.agent.telemetry.metrics.turn_in_flight(), \
                invoke_agent_span(tracer, agent_name=agent_name(self.settings.name, req),
                                  conversation_id=req.session_id, model=self.model,
                                  provider=self.agent.provider.name, attributes=attributes) as span:
            context_of = span.get_span_context()
            self.trace_id = format(context_of.trace_id, "032x") if context_of.is_valid else ""
            self._span = span
            if self._held is None:  # else once its session is open (_opened)
                self._emit(RunStartedEvent(trace_id=self.trace_id))
            started = time.monotonic()
            try:
                stop_reason, final_text = await self._turn()
            except asyncio.CancelledError:
                stop_reason, final_text = self._interrupted_as or "cancelled", ""
                await self._shown.settle(self.settings.memory_timeout_s)
                await self._answer_unrun_calls(stop_reason)
                span.set_status(Status(StatusCode.ERROR, stop_reason))
                span.set_attribute(ERROR_TYPE, stop_reason)
            except AgentmeshError as exc:
                log.warning("turn failed", code=exc.code, error=exc.message)
                await self._shown.settle(self.settings.memory_timeout_s)
                span.set_status(Status(StatusCode.ERROR, exc.message))
                span.set_attribute(ERROR_TYPE, exc.code)
                await self._after_turn("error")
                await self._usage_tag.flush()
                self._emit(RunErrorEvent(code=exc.code, message=exc.message, reason=exc.reason, metadata=exc.metadata))
                return
            except Exception as exc:  # a bug must end the turn with a clear event
                log.exception("turn crashed")
                await self._shown.settle(self.settings.memory_timeout_s)
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                await self._after_turn("error")
                await self._usage_tag.flush()
                self._emit(RunErrorEvent(code="INTERNAL", message=f"the agent failed: {type(exc).__name__}: {exc}"))
                return
            await self._shown.settle(self.settings.memory_timeout_s)
            await self._after_turn(stop_reason)
            set_usage(span, input_tokens=self.usage.input_tokens, output_tokens=self.usage.output_tokens)
            span.set_attributes({
                "agentmesh.iterations": self.iterations,
                "agentmesh.stop_reason": stop_reason,
            })
            log.info("turn finished", stop_reason=stop_reason, iterations=self.iterations,
                     seconds=round(time.monotonic() - started, 3))
            tokens, window = self._ctx.fill  # how full the window is, for the client to show
            if window:
                self._emit(StatusEvent(f"context: {tokens:,} of {window:,} tokens ({tokens * 100 // window}%)",
                                       context_tokens=tokens, context_window=window))
            await self._usage_tag.flush()
            self._emit(RunFinishedEvent(usage=self.usage, iterations=self.iterations, final_text=final_text,
                                        trace_id=self.trace_id, stop_reason=stop_reason))

    async def _turn(self) -> tuple[str, str]:
        req = self.request
        # Stored before the message that references them; a bad one ends the turn before anything is.
        images = await store_given(self.agent.images, workspace_of(req), req.images, self.settings.max_image_bytes)
        user = ChatMessage(role="user", content=req.message, run_id=req.run_id, images=images)
        started = await self._startup.run(user, self._capabilities, persist=self._persist, writing=self._writing)
        self._ctx.stored, history, memories = started.stored, started.history, started.memories
        self._ctx.catalog = list(self._startup.remote_tools) if self._startup.remote_catalog_known else None
        for capability in self._capabilities:
            history = await capability.prepare_history(history)
        # The catalog again: capabilities' tools may depend on what their `load` read (skills).
        self._ctx.history, self._ctx.tools, self._ctx.memories = history, self._catalog_of_now(), memories
        turn = self._turn_messages = [user]
        for capability in self._capabilities:
            stop = await capability.before_first_call(turn)
            if stop is not None:
                return stop.stop_reason, stop.final_text
        for step in range(1, self.max_iterations + 1):
            for capability in self._capabilities:
                await capability.before_step(step, turn)
            self._ctx.tools = self._catalog_of_now()
            reply = await self._model.step_reply(turn)
            assistant = ChatMessage(role="assistant", content=self._model.stored_text(reply), tool_calls=reply.tool_calls,
                                    run_id=req.run_id)
            self._unanswered = reply.tool_calls
            await self._persist([assistant])
            turn.append(assistant)
            verdict = await self._verdict(step, reply, turn)
            if isinstance(verdict, Stop):
                self._unanswered = ()
                await self._tool_calls.not_run(reply.tool_calls, verdict.stop_reason, verdict.not_run)
                return verdict.stop_reason, verdict.final_text or reply.text
            if not reply.tool_calls:
                if isinstance(verdict, Nudge):
                    turn.append(ChatMessage(role="system", content=verdict.note))
                    continue
                return "completed", reply.text
            # From here ToolCalls records a result for every call, however the step ends.
            self._unanswered = ()
            results, unsaved = await self._tool_calls.run(reply.tool_calls)
            self._shown.hold(functools.partial(self._tool_calls.save, unsaved), [ToolResultEvent(o) for o in unsaved])
            turn.extend(results)
        # Out of steps: one last call without tools, so the user gets an answer, not silence.
        self._emit(StatusEvent(f"reached the limit of {self.max_iterations} steps; asking the model for a summary"))
        note = ChatMessage(role="system", content=context.SUMMARY_INSTRUCTION.format(n=self.max_iterations))
        reply = await self._model.call(turn, extra=[note], allow_tools=False)
        await self._persist([ChatMessage(role="assistant", content=reply.text, run_id=req.run_id)])
        return "max_iterations", reply.text

    async def _verdict(self, step: int, reply: ModelReply, turn: list[ChatMessage]) -> Verdict:
        """Every capability sees the reply; the first Stop wins, else the first Nudge."""
        nudge: Nudge | None = None
        for capability in self._capabilities:
            verdict = await capability.after_reply(step, reply, turn)
            if isinstance(verdict, Stop):
                return verdict
            if isinstance(verdict, Nudge) and nudge is None:
                nudge = verdict
        return nudge

    async def _after_turn(self, stop_reason: str) -> None:
        for capability in self._capabilities:
            try:
                await capability.after_turn(stop_reason)
            except Exception:
                log.exception("a capability failed after the turn", capability=type(capability).__name__)

    # --- context ------------------------------------------------------------------------------

    def _catalog_of_now(self) -> list[ToolSpec]:
        """The remote tools and every capability's `tools()` as they are now (a capability's own
        win a name clash). Asked again before each step: a tool a capability gains mid-turn (a
        promoted tool) is offered from the next step."""
        own: list[ToolSpec] = []
        for capability in self._capabilities:
            for spec in capability.tools():
                self._tool_owners[spec.name] = capability
                own.append(spec)
        specs = [s for s in self._startup.remote_tools if s.name not in self._tool_owners] + own
        # A tool the policies turn off is not offered at all; a call to it anyway is screened.
        servers = tool_access.mcp_servers_of(self.request.agent)
        specs = [s for s in specs if tool_access.offered(self.request.tool_policies, s.name, servers)]
        self._catalog = {s.name: s for s in specs}
        return specs

    async def _persist(self, messages: list[ChatMessage]) -> None:
        if self._shown.pending:  # in order: what the turn saves comes after those results
            await self._shown.save()
        async with self._writing():
            await self.agent.transcripts.append(self.request.session_id, messages)

    @contextlib.asynccontextmanager
    async def _writing(self) -> AsyncIterator[None]:
        # A write is not a safe point: an interrupt arriving meanwhile lands when it is done.
        self._persisting += 1
        try:
            yield
        finally:
            self._persisting -= 1
            if self._interrupted_as and not self._persisting:
                self._deliver_interrupt()

    async def _answer_unrun_calls(self, stop_reason: str) -> None:
        """The turn stopped between persisting a reply and running its calls: record a result
        for each, so the stored transcript is valid to replay as it stands."""
        calls, self._unanswered = self._unanswered, ()
        if calls:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    self._tool_calls.not_run(calls, stop_reason, f"error: not run: the turn was {stop_reason.replace('_', ' ')}"),
                    self.settings.memory_timeout_s)

    async def _call_model(self, turn: list[ChatMessage], **options: Any) -> ModelReply:
        return await self._model.call(turn, **options)

    async def _inject(self, messages: list[ChatMessage]) -> None:
        await self._persist(messages)
        self._turn_messages.extend(messages)

    # --- tool calls ---------------------------------------------------------------------------

    def _screen(self, call: ToolCall) -> ToolOutcome | None:
        refused = tool_access.refusal(call, self.request.tool_policies, self._catalog,
                                      catalog_known=self._startup.remote_catalog_known, owned=self._tool_owners,
                                      mcp_servers=tool_access.mcp_servers_of(self.request.agent))
        if refused is not None:
            log.info("tool call refused", tool=call.name, call_id=call.call_id, reason=refused.error_kind)
        return refused

    def _read_only(self, name: str) -> bool:
        spec = self._catalog.get(name)
        return spec is not None and spec.read_only

    async def _dispatch(self, call: ToolCall) -> ToolOutcome:
        owner = self._tool_owners.get(call.name)
        if owner is not None:
            return await owner.execute(call)
        if self._startup.remote_catalog_known and call.name not in self._catalog:
            available = ", ".join(sorted(self._catalog)) or "none"
            return ToolOutcome.error(call, "not_found", f"error: there is no tool named {call.name!r}; available: {available}")
        # A sub-agent's tools work in its root session's workspace, so files are shared.
        return await self.agent.tools.execute(workspace_of(self.request), call, self.request.namespace,
                                              mcp_version=self.request.mcp_servers_version,
                                              sandbox_template=self.request.sandbox_template,
                                              isolation=self.request.isolation)
