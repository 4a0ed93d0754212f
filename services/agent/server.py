"""gRPC adapter of the agent: `Agent.RunTurn` streams one turn's events (and takes approval
decisions on the same stream); wiring to its peers."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from typing import Any

import httpx
from google.protobuf import json_format

from agentmesh.agent import types as t
from agentmesh.agent.adapters.background_sessions import KnownBackground
from agentmesh.agent.adapters.images import GrpcImageFiles
from agentmesh.agent.adapters.learning import GrpcInstructions, GrpcPromotedTools, GrpcReflectionBackend, GrpcSkills
from agentmesh.agent.adapters.memory import (
    GrpcLongTermMemory,
    GrpcTranscripts,
    GrpcTurnStart,
    GrpcUsageLog,
    MemoryNamedAgents,
    UsageOutbox,
)
from agentmesh.agent.adapters.model_calls import GrpcModelCallLog
from agentmesh.agent.adapters.namespace_models import MountedKeyModels
from agentmesh.agent.adapters.scheduler import GrpcWakeups
from agentmesh.agent.adapters.teams import GatewayTeammateRuns, GrpcTeamStore
from agentmesh.agent.adapters.tool_catalog import CachedCatalog
from agentmesh.agent.adapters.tools import GrpcBackgroundCommands, GrpcToolRunner
from agentmesh.agent.adapters.watches import BackgroundWatch, CatalogWatch
from agentmesh.agent.capabilities.learning import LearningSources
from agentmesh.agent.capabilities.reflection import Reflector
from agentmesh.agent.capabilities.registry import for_turn
from agentmesh.agent.capabilities.team_store import TeamServices
from agentmesh.agent.capabilities.wakeups import Wakeups, WakeupScheduler
from agentmesh.agent.loop.call_payloads import CallRecorder
from agentmesh.agent.loop.images import GivenImage
from agentmesh.agent.loop.model_choice import NamedModel
from agentmesh.agent.loop.run import Agent
from agentmesh.agent.loop.session_open import SessionToOpen
from agentmesh.agent.loop.turn_request import TurnRequest
from agentmesh.agent.providers import build_provider, model_keys
from agentmesh.agent.providers.text_tools import TextToolCalls
from agentmesh.agent.providers.window_probe import probe_window
from agentmesh.agent.settings import AgentSettings
from agentmesh.clients.gateway import GatewayClient, SchedulerClient
from agentmesh.clients.memory import MemoryClient
from agentmesh.clients.tools import ToolsClient
from agentmesh.config import Settings
from agentmesh.errors import FailedPrecondition, InvalidArgument
from agentmesh.ids import PARENT_SESSION_LABEL, new_id, validate_id, validate_namespace
from agentmesh.images import validate_images
from agentmesh.internal.v1 import agent_service_pb2, agent_service_pb2_grpc
from agentmesh.logs import get_logger, secrets_of
from agentmesh.models import DEFAULT_MODEL, ModelCatalog, catalog_of
from agentmesh.modes import validate_mode
from agentmesh.rpc.client import open_channel
from agentmesh.rpc.convert import tool_result_to_proto
from agentmesh.rpc.errors import translate_errors
from agentmesh.rpc.identity import ServiceIdentity
from agentmesh.rpc.server import MAX_MESSAGE_BYTES, ServiceHost
from agentmesh.telemetry import Telemetry
from agentmesh.tls import httpx_context
from agentmesh.toolpolicy import validate_permission_mode, validate_policy
from agentmesh.turn_input import MAX_TOOL_NAME_CHARS, TurnLimits, validate_turn
from agentmesh.v1 import common_pb2, learning_pb2

log = get_logger("agentmesh.agent")

# Above any gateway's AGENTMESH_GATEWAY_MAX_MESSAGE_CHARS: the gateway holds turns to its own bound.
MAX_MESSAGE_CHARS = 1_000_000
# The gateway bounds a message's images by its settings; this only keeps a request sane.
MAX_IMAGES = 64


def event_to_proto(event: t.RunEvent, request: agent_service_pb2.RunTurnRequest, seq: int) -> common_pb2.Event:
    base: dict[str, Any] = {"session_id": request.session_id, "run_id": request.run_id, "seq": seq, "timestamp": time.time()}
    if isinstance(event, t.RunStartedEvent):
        return common_pb2.Event(**base, run_started=common_pb2.RunStarted(
            session_id=request.session_id, run_id=request.run_id, trace_id=event.trace_id,
            namespace=event.namespace, session_created=event.session_created))
    if isinstance(event, t.TextDeltaEvent):
        return common_pb2.Event(**base, text_delta=common_pb2.TextDelta(text=event.text))
    if isinstance(event, t.ReasoningDeltaEvent):
        return common_pb2.Event(**base, reasoning_delta=common_pb2.ReasoningDelta(text=event.text))
    if isinstance(event, t.TaskUpdateEvent):
        return common_pb2.Event(**base, task_update=task_board_to_proto(event.tasks))
    if isinstance(event, t.TeammateStatusEvent):
        usage = common_pb2.Usage(input_tokens=event.input_tokens, output_tokens=event.output_tokens,
                                 total_tokens=event.input_tokens + event.output_tokens)
        return common_pb2.Event(**base, teammate_status=common_pb2.TeammateStatus(
            name=event.name, state=event.state, session_id=event.session_id, run_id=event.run_id, role=event.role,
            current_task=event.current_task, last_message=event.last_message, usage=usage))
    if isinstance(event, t.SubagentEvent):
        return common_pb2.Event(**base, subagent=common_pb2.SubagentStatus(
            state=event.state, call_id=event.call_id, index=event.index, depth=event.depth, task=event.task,
            agent=event.agent, agent_version=event.agent_version, session_id=event.session_id, run_id=event.run_id,
            stop_reason=event.stop_reason, iterations=event.iterations, usage=usage_to_proto(event.usage)))
    if isinstance(event, t.BackgroundResultEvent):
        d = event.done
        return common_pb2.Event(**base, background_result=common_pb2.BackgroundResult(
            id=d.id, command=d.command, status=d.status, seconds=d.seconds, result=tool_result_to_proto(d.result)))
    if isinstance(event, t.ToolCallEvent):
        c = event.call
        return common_pb2.Event(**base, tool_call=common_pb2.ToolCallStarted(
            call_id=c.call_id, name=c.name, arguments_json=c.arguments_json))
    if isinstance(event, t.ToolResultEvent):
        return common_pb2.Event(**base, tool_result=common_pb2.ToolCallFinished(result=tool_result_to_proto(event.result)))
    if isinstance(event, t.ApprovalRequestEvent):
        c = event.call
        return common_pb2.Event(**base, approval_request=common_pb2.ApprovalRequested(
            call_id=c.call_id, name=c.name, arguments_json=c.arguments_json, timeout_s=event.timeout_s))
    if isinstance(event, t.ApprovalResolvedEvent):
        return common_pb2.Event(**base, approval_resolved=common_pb2.ApprovalResolved(
            call_id=event.call.call_id, name=event.call.name, approved=event.approved, note=event.note,
            decided_by=event.decided_by, arguments_json=event.arguments_json))
    if isinstance(event, t.StatusEvent):
        return common_pb2.Event(**base, status=common_pb2.RunStatus(
            message=event.message, context_tokens=event.context_tokens, context_window=event.context_window))
    if isinstance(event, t.RunFinishedEvent):
        return common_pb2.Event(**base, run_finished=common_pb2.RunFinished(
            usage=usage_to_proto(event.usage),
            iterations=event.iterations, final_text=event.final_text, trace_id=event.trace_id,
            stop_reason=event.stop_reason))
    if isinstance(event, t.RunErrorEvent):
        return common_pb2.Event(**base, error=common_pb2.RunError(code=event.code, message=event.message,
                                                                  reason=event.reason, metadata=event.metadata))
    raise TypeError(f"unknown run event {event!r}")


def usage_to_proto(u: t.Usage) -> common_pb2.Usage:
    return common_pb2.Usage(input_tokens=u.input_tokens, output_tokens=u.output_tokens, total_tokens=u.total_tokens,
                            cached_input_tokens=u.cached_input_tokens)


def task_board_to_proto(tasks) -> common_pb2.TaskBoard:
    return common_pb2.TaskBoard(tasks=[
        common_pb2.Task(id=k.id, subject=k.subject, description=k.description, status=k.status, owner=k.owner,
                        blocked_by=list(k.blocked_by), blocked=k.blocked)
        for k in tasks
    ])


class AgentServicer(agent_service_pb2_grpc.AgentServicer):
    def __init__(self, agent: Agent, settings: AgentSettings, reflector: Reflector | None = None):
        self._agent = agent
        self._settings = settings
        self._reflector = reflector
        self._turn_limits = TurnLimits(MAX_MESSAGE_CHARS, settings.max_iterations_cap)

    @translate_errors
    async def Reflect(self, request, context):
        validate_id(request.session_id, "session_id")
        if self._reflector is None:
            raise FailedPrecondition("reflection is not configured on this agent")
        trigger = request.trigger or "on demand"
        if trigger not in ("on demand", "idle"):
            raise InvalidArgument(f"trigger is 'on demand' or 'idle', not {trigger!r}")
        run = await self._reflector.reflect(request.session_id, trigger)
        return learning_pb2.ReflectResponse(run=json_format.ParseDict(run, learning_pb2.ReflectionRun()))

    def _validate(self, request: agent_service_pb2.RunTurnRequest) -> TurnRequest:
        if request.run_id:
            validate_id(request.run_id, "run_id")
        if request.namespace:
            validate_namespace(request.namespace)
        options = request.options
        # The gateway checked the same rules (agentmesh.turn_input); again here, with the agent's bounds.
        validate_turn(request.session_id, request.message, options, self._turn_limits, has_images=bool(request.images))
        images = validate_images(request.images, max_count=MAX_IMAGES, max_bytes=self._settings.max_image_bytes)
        mode = validate_mode(options.mode)
        permission_mode = options.permission_mode
        # The gateway resolved and checked them against the catalog; here only their form.
        if len(request.tool_policies) > 8:
            raise InvalidArgument(f"tool_policies has {len(request.tool_policies)} layers; at most 8")
        policies = tuple(validate_policy(p.allow, p.deny, "tool_policies") for p in request.tool_policies)
        if options.HasField("tools"):
            policies += (validate_policy(options.tools.allow, options.tools.deny, "options.tools"),)
        opening = session_to_open(request) if request.HasField("open_session") else None
        return TurnRequest(
            session_id=request.session_id,
            run_id=request.run_id or new_id("run"),
            message=request.message,
            namespace=request.namespace or "default",
            max_iterations=options.max_iterations,
            model=options.model,
            system_prompt=options.system_prompt,
            approval_tools=frozenset(options.approval_tools),
            mode=mode,
            token_budget=options.token_budget,
            session_token_budget=options.session_token_budget,
            plan=options.plan or options.plan_auto_approve,
            plan_auto_approve=options.plan_auto_approve,
            permission_mode=permission_mode,
            tool_policies=policies,
            mcp_servers_version=request.mcp_servers_version if request.HasField("mcp_servers_version") else None,
            opening=opening,
            compact=options.compact,
            compact_focus=options.compact_focus[:500],
            images=tuple(GivenImage(data=i.data, path=i.path, name=i.name) for i in images),
        )

    @translate_errors
    async def RunTurn(self, request_iterator, context):
        request = await anext(aiter(request_iterator), None)
        if request is None or request.HasField("decision"):
            raise InvalidArgument("RunTurn must start with a request naming the session and the message")
        turn = self._validate(request)
        if not request.run_id:
            request = agent_service_pb2.RunTurnRequest(session_id=turn.session_id, run_id=turn.run_id)
        run = self._agent.start(turn)
        decisions = asyncio.create_task(_apply_decisions(request_iterator, run), name=f"decisions-{turn.run_id}")
        seq = 0
        try:
            # A cancelled RPC cancels this generator, which cancels the turn's task (see TurnRun.events).
            async for event in run.events():
                seq += 1
                yield event_to_proto(event, request, seq)
        finally:
            decisions.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await decisions


INTERRUPT_REASONS = ("interrupted", "rolled_back")


def session_to_open(request: agent_service_pb2.RunTurnRequest) -> SessionToOpen:
    """The gateway's session defaults and deployment settings (session_open.py), their form checked."""
    given = request.open_session
    session = given.session
    if session.session_id and session.session_id != request.session_id:
        raise InvalidArgument("open_session.session.session_id must be the turn's session_id")
    if session.namespace and session.namespace != (request.namespace or "default"):
        raise InvalidArgument("open_session.session.namespace must be the turn's namespace")
    deployment = given.deployment_tools
    return SessionToOpen(
        title=session.title, labels=dict(session.labels), created_at=session.created_at,
        deployment_tools=validate_policy(deployment.allow, deployment.deny, "open_session.deployment_tools"),
        deployment_permission_mode=validate_permission_mode(given.deployment_permission_mode,
                                                            "open_session.deployment_permission_mode"),
        agent=request.options.agent,
    )


async def _apply_decisions(request_iterator, run) -> None:
    """Feed the decisions (and an interrupt) that follow the first message to the run. The caller
    half-closing (a plain one-message call) only means no decision will come: held calls then time out."""
    # Started before the turn's task: one hop of the event loop, so the turn's first step (up to
    # its StartTurn call) runs before this waits on the stream; a decision waits there meanwhile.
    await asyncio.sleep(0)
    async for message in request_iterator:
        if message.interrupt:
            if message.interrupt not in INTERRUPT_REASONS:
                log.warning("unknown interrupt reason; interrupting", reason=message.interrupt[:64])
            run.interrupt(message.interrupt if message.interrupt in INTERRUPT_REASONS else "interrupted")
            continue
        if not message.HasField("decision"):
            continue
        d = message.decision
        if not run.decide(d.call_id, d.approved, d.note, d.rest_of_turn, d.arguments_json):
            # The gateway checks first, so this is a race with the timeout or a cancel: harmless.
            log.info("decision for a call that is not waiting", call_id=d.call_id[:MAX_TOOL_NAME_CHARS])


class MemoryChildSessions:
    """Sub-agents' sessions in the memory service, so their transcripts are stored and listed
    like any other (`agentmesh sessions show <child id>`); labels point back to the parent."""

    def __init__(self, client: MemoryClient):
        self._client = client

    async def open_child(self, session_id: str, *, parent_session_id: str, namespace: str, title: str) -> None:
        await self._client.put_session(session_id, title=title, namespace=namespace,
                                       labels={PARENT_SESSION_LABEL: parent_session_id, "role": "sub-agent"})


def build_named_models(catalog: ModelCatalog, settings: Settings, agent_settings: AgentSettings, telemetry: Telemetry):
    """A provider for each catalogue model but the default (built by the caller); their closers."""
    named: dict[str, NamedModel] = {}
    closers = []
    for spec in catalog.models.values():
        if spec.name == DEFAULT_MODEL:
            continue
        limit = settings.llm.max_concurrency if spec.max_concurrency is None else spec.max_concurrency
        llm = dataclasses.replace(settings.llm, provider=spec.provider, base_url=spec.base_url.rstrip("/"),
                                  model=spec.model, api_key=spec.api_key, max_concurrency=limit)
        # Every configured key is masked in every model's replies: one could be told another's.
        provider, close = build_provider(llm, agent_settings, telemetry, name=spec.name, keys=model_keys(settings.llm))
        if spec.text_tool_calls:
            provider = TextToolCalls(provider)
        named[spec.name] = NamedModel(spec.name, provider, spec.model, spec.fallback, spec.max_output_tokens,
                                      temperature=spec.temperature, top_p=spec.top_p,
                                      context_window=spec.context_window, vision=spec.vision)
        closers.append(close)
    return named, closers


async def learn_windows(agent: Agent, catalog: ModelCatalog, settings: AgentSettings, *, default_key: str = "",
                        within_s: float = 2.0) -> None:
    """Ask the server of each OpenAI-compatible model whose window is not configured how large it
    is (window_probe.py), once, at start-up and within `within_s`: a server that is away or slow
    leaves the default (AGENTMESH_AGENT_CONTEXT_WINDOW), it does not hold the service back."""
    unknown = [spec for spec in catalog.models.values() if spec.provider == "openai" and not spec.context_window]
    if not unknown:
        return
    async with httpx.AsyncClient(timeout=httpx.Timeout(within_s), trust_env=True, verify=httpx_context()) as http:
        try:
            async with asyncio.timeout(within_s):
                found = await asyncio.gather(*(
                    probe_window(http, s.base_url, s.model, default_key if s.name == DEFAULT_MODEL else s.api_key)
                    for s in unknown))
        except TimeoutError:
            found = [0] * len(unknown)
    for spec, window in zip(unknown, found, strict=True):
        if window and spec.name in agent.models:
            agent.models[spec.name] = dataclasses.replace(agent.models[spec.name], context_window=window)
        log.info("model context window", model=spec.name, window=window or settings.context_window,
                 source="the server" if window else "AGENTMESH_AGENT_CONTEXT_WINDOW")


def with_wakeups(scheduler: WakeupScheduler, teams: TeamServices | None = None):
    """The registry's capabilities (teams with the memory and gateway they reach), and
    schedule_wakeup with the scheduler it reaches — for a user's turn; a sub-agent's session is
    not one to resume later."""
    def capabilities(ctx):
        found = for_turn(ctx, teams)
        if ctx.request.subagent is None:
            found.append(Wakeups(ctx, scheduler))
        return found
    return capabilities


async def build(settings: Settings, telemetry: Telemetry, address: str | None = None) -> ServiceHost:
    agent_settings = settings.section(AgentSettings)
    models = catalog_of(settings.llm)
    # The default model: a catalogue entry named `default`, else the AGENTMESH_LLM_* settings.
    default = models.get(DEFAULT_MODEL)
    assert default is not None  # catalog_of always has one
    llm = settings.llm if DEFAULT_MODEL not in settings.llm.models else dataclasses.replace(
        settings.llm, provider=default.provider, base_url=default.base_url.rstrip("/"), model=default.model,
        api_key=default.api_key)
    provider, close_provider = build_provider(llm, agent_settings, telemetry)
    if default.text_tool_calls:
        provider = TextToolCalls(provider)
    tools_target, memory_target = settings.address_of("tools"), settings.address_of("memory")
    # No tracing interceptor on this channel: it would swallow cancellation (see GrpcToolRunner).
    identity = ServiceIdentity.open("agent", settings.keys_dir)
    tools_channel = open_channel(tools_target, identity=identity, audience="tools")
    memory_channel = open_channel(memory_target, telemetry, identity=identity, audience="memory")
    scheduler_target = settings.address_of("scheduler")
    scheduler_channel = open_channel(scheduler_target, telemetry, identity=identity, audience="scheduler")
    # Teammates start as runs through the gateway (capabilities/teams.py), on any agent replica.
    gateway_target = settings.address_of("gateway")
    gateway_channel = open_channel(gateway_target, telemetry, identity=identity, audience="gateway")
    # A turn's start, every step's append and every tool call ride one stream to each service
    # (agentmesh.rpc.carried), each message still a call of its own.
    rpc_tracer = telemetry.tracer_provider.get_tracer("agentmesh.rpc")
    memory_client = MemoryClient(memory_channel, memory_target, timeout_s=agent_settings.memory_timeout_s,
                                 carry=(identity, rpc_tracer))
    tools_client = ToolsClient(tools_channel, tools_target, carry=(identity, rpc_tracer))
    named, closers = build_named_models(models, settings, agent_settings, telemetry)
    named[DEFAULT_MODEL] = NamedModel(DEFAULT_MODEL, provider, llm.model_name, default.fallback,
                                      default.max_output_tokens, temperature=default.temperature, top_p=default.top_p,
                                      context_window=default.context_window, vision=default.vision)
    tools = GrpcToolRunner(tools_client, timeout_s=agent_settings.tool_timeout_s)
    # The catalog kept between turns, told of changes by the tools service (tool_catalog.py).
    catalog = CachedCatalog(tools.listing)
    catalog_watch = CatalogWatch(tools_client, catalog)
    # Which sessions have background commands to collect, told by the tools service (background_sessions.py).
    known_background = KnownBackground()
    background_watch = BackgroundWatch(tools_client, known_background)
    # A model call's usage record rides on the append of the step it produced.
    usage_outbox = UsageOutbox(agent_settings.usage_hold_s)
    # Used by the turns of a session that records its calls, or of every session with
    # AGENTMESH_AGENT_RECORD_MODEL_CALLS (loop/turn_start.py); other turns have none.
    recorder = CallRecorder(GrpcModelCallLog(memory_client, usage_outbox), [*secrets_of(settings), *model_keys(settings.llm)],
                            agent_settings.model_call_max_chars)
    # The namespaces' own models (ModelConfig resources), their keys from mounted Secrets.
    namespace_models = MountedKeyModels(settings.llm, agent_settings, telemetry, agent_settings.model_secrets_dir,
                                        keys=model_keys(settings.llm),
                                        also_mask=recorder.mask_also)
    agent = Agent(
        models=named,
        provider=provider,
        tools=tools,
        catalog=catalog,
        compaction_model=settings.llm.compaction_model,
        transcripts=GrpcTranscripts(memory_client, save_within_s=agent_settings.memory_timeout_s, outbox=usage_outbox),
        memory=GrpcLongTermMemory(memory_client, memory_target, agent_settings.memory_timeout_s),
        settings=agent_settings,
        model=llm.model_name,
        telemetry=telemetry,
        # What plugs into a turn (capabilities/registry.py), and the wake-ups the scheduler keeps.
        capabilities=with_wakeups(GrpcWakeups(SchedulerClient(scheduler_channel, scheduler_target)),
                                  TeamServices(GrpcTeamStore(memory_client),
                                               GatewayTeammateRuns(GatewayClient(gateway_channel, gateway_target)))),
        sessions=MemoryChildSessions(memory_client),
        agents=MemoryNamedAgents(memory_client),
        background=GrpcBackgroundCommands(tools_client, known=known_background),
        images=GrpcImageFiles(tools_client),
        default_vision=settings.llm.vision,
        usage_log=GrpcUsageLog(memory_client, usage_outbox),
        call_recorder=recorder,
        namespace_models=namespace_models,
        turn_start=GrpcTurnStart(memory_client, memory_target, save_within_s=agent_settings.memory_timeout_s),
        learning=LearningSources(instructions=GrpcInstructions(memory_client), skills=GrpcSkills(memory_client),
                                  promoted_tools=GrpcPromotedTools(memory_client), with_turn_start=True),
    )
    await learn_windows(agent, models, agent_settings, default_key=llm.api_key)
    # A turn request holds the gateway's message (<= 100k characters by default), its options and
    # the user's images (AGENTMESH_GATEWAY_MAX_IMAGES_TOTAL_BYTES together, 12 MiB by default).
    host = ServiceHost("agent", settings, telemetry, address=address, identity=identity,
                       max_receive_bytes=MAX_MESSAGE_BYTES)
    # Reflection talks to AGENTMESH_REFLECTION_MODEL, else the session's own model.
    reflector = Reflector(agent.models, GrpcReflectionBackend(memory_client), telemetry,
                          model=settings.llm.reflection_model, max_tokens=agent_settings.max_tokens)
    host.add(agent_service_pb2_grpc.add_AgentServicer_to_server, AgentServicer(agent, agent_settings, reflector),
             "agentmesh.internal.v1.Agent")

    catalog_watch.start()
    background_watch.start()

    async def close() -> None:
        await catalog_watch.close()
        await background_watch.close()
        await close_provider()
        for close_named in closers:
            await close_named()
        await namespace_models.aclose()
        await tools.close()
        await tools_channel.close()
        await memory_client.close()
        await memory_channel.close()
        await scheduler_channel.close()
        await gateway_channel.close()

    host.on_stop(close)
    return host
