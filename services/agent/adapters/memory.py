"""The loop's ports over gRPC: the tools service (catalog, sandboxed execution) and the memory
service (transcripts, long-term memory, the usage ledger). Protobuf stops here; the core sees `types`."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Sequence, cast

import grpc

from agentmesh.agent.adapters.kept_transcripts import KeptTranscripts
from agentmesh.agent.adapters.learning import instructions_from_proto, skill_summary_from_proto, stored_tool_from_proto
from agentmesh.agent.adapters.model_calls import call_to_proto
from agentmesh.agent.capabilities.learning import INSTRUCTIONS, PROMOTED_TOOLS, SKILLS, Learned
from agentmesh.agent.capabilities.recall_tools import BlockEdited, ConversationFound
from agentmesh.agent.loop.call_payloads import RecordedCall
from agentmesh.agent.loop.ports import MemoryHit, NotSupported, TurnBeginning
from agentmesh.agent.loop.session_open import NamedAgent, OpenedSession, SessionToOpen
from agentmesh.agent.loop.usage_log import UsageEntry
from agentmesh.agent.types import ChatMessage, Role, ToolCall
from agentmesh.clients.memory import MemoryClient
from agentmesh.errors import AgentmeshError, InvalidArgument, NotFound, PermissionDenied, Unavailable
from agentmesh.internal.v1 import memory_service_pb2
from agentmesh.logs import get_logger
from agentmesh.models import ModelSpec
from agentmesh.rpc.convert import image_from_proto, image_to_proto
from agentmesh.rpc.peers import peer_error
from agentmesh.toolpolicy import ToolPolicy
from agentmesh.v1 import agents_pb2, common_pb2, learning_pb2, sessions_pb2

log = get_logger("agentmesh.agent")



# --- conversions ----------------------------------------------------------------------------


def message_to_proto(m: ChatMessage) -> common_pb2.Message:
    return common_pb2.Message(
        role=m.role,
        content=m.content,
        tool_calls=[common_pb2.ToolCall(call_id=c.call_id, name=c.name, arguments_json=c.arguments_json) for c in m.tool_calls],
        tool_call_id=m.tool_call_id,
        name=m.name,
        run_id=m.run_id,
        kind=m.kind,
        covers_through_seq=m.covers_through_seq,
        images=[image_to_proto(i) for i in m.images],
    )


_ROLES = frozenset(("system", "user", "assistant", "tool"))


def message_from_proto(m: common_pb2.Message) -> ChatMessage:
    # Every turn converts its whole transcript: no generator for the (usual) message without calls.
    role = m.role
    calls = m.tool_calls
    return ChatMessage(
        role=cast(Role, role) if role in _ROLES else "user",
        content=m.content,
        tool_calls=tuple([ToolCall(c.call_id, c.name, c.arguments_json or "{}") for c in calls]) if calls else (),
        tool_call_id=m.tool_call_id,
        name=m.name,
        run_id=m.run_id,
        seq=m.seq,
        kind=m.kind,
        covers_through_seq=m.covers_through_seq,
        images=tuple([image_from_proto(i) for i in m.images]) if m.images else (),
    )


# --- memory ---------------------------------------------------------------------------------


# What an append carries: a model call's usage record, and its payloads when they are recorded.
Carried = UsageEntry | RecordedCall


class UsageOutbox:
    """Usage records (and recorded model calls, call_payloads.py) waiting for their session's next transcript append to carry them.

    A model call's record is handed over as soon as the call ends (usage_log.py), and the loop
    persists the step that call produced right after: sent with that append, the record costs
    no round trip of its own (two fewer calls to memory in a tool-using turn). A record no
    append takes within `wait_s` — a call whose output is not persisted — is sent on its own
    (RecordUsage), as is one the append could not record. Holding a record is synchronous (a
    timer, no task), so the append that follows finds it without yielding to the event loop."""

    def __init__(self, wait_s: float = 0.02):
        self._wait_s = wait_s
        self._waiting: dict[str, list[HeldUsage]] = {}

    def hold(self, entry: Carried, send_alone: Callable[[Any], Awaitable[None]]) -> "asyncio.Future[None]":
        """Keep `entry` for the session's next append; done once it is stored by one way or the other."""
        loop = asyncio.get_running_loop()
        held = HeldUsage(entry, loop.create_future(), send_alone)
        held.timer = loop.call_later(self._wait_s, self._expire, held)
        self._waiting.setdefault(entry.session_id, []).append(held)
        return held.stored

    def take(self, session_id: str) -> list["HeldUsage"]:
        """The session's waiting records, for an append to carry; it settles each (HeldUsage.settle)."""
        taken = self._waiting.pop(session_id, [])
        for held in taken:
            if held.timer is not None:
                held.timer.cancel()
        return taken

    def _expire(self, held: "HeldUsage") -> None:
        waiting = self._waiting.get(held.entry.session_id, [])
        if held in waiting:
            waiting.remove(held)
            if not waiting:
                del self._waiting[held.entry.session_id]
        held.send()


@dataclass(eq=False)
class HeldUsage:
    entry: Carried
    stored: "asyncio.Future[None]"
    send_alone: Callable[[Any], Awaitable[None]]
    timer: asyncio.TimerHandle | None = None

    def settle(self, recorded: bool) -> None:
        """The carrying append is over: stored with it, or (not recorded) sent alone now."""
        if recorded:
            if not self.stored.done():
                self.stored.set_result(None)
        else:
            self.send()

    def send(self) -> None:
        sending = asyncio.ensure_future(self.send_alone(self.entry))
        sending.add_done_callback(self._sent)

    def _sent(self, sending: "asyncio.Future[None]") -> None:
        if self.stored.done():
            return
        error = None if sending.cancelled() else sending.exception()
        if sending.cancelled():
            self.stored.cancel()
        elif error is not None:
            self.stored.set_exception(error)
        else:
            self.stored.set_result(None)


def usage_to_proto(entry: UsageEntry) -> memory_service_pb2.UsageRecord:
    u = entry.usage
    return memory_service_pb2.UsageRecord(
        id=entry.id, at=entry.at, session_id=entry.session_id, run_id=entry.run_id, namespace=entry.namespace,
        model_name=entry.model_name, model=entry.model, provider=entry.provider, input_tokens=u.input_tokens,
        output_tokens=u.output_tokens, cached_input_tokens=u.cached_input_tokens, fallback=entry.fallback,
        purpose=entry.purpose, root_session_id=entry.root_session_id,
    )


class GrpcTranscripts:
    """Transcripts on the memory service. An append that finds memory away (restarting, a
    replica gone) is retried until it is saved or `save_within_s` has passed: the loop shows a
    step to the client only once it is saved, so a short outage delays the turn instead of
    failing it, and a long one fails it before anything unsaved is shown. An append carries the
    session's usage records waiting in `outbox` (UsageOutbox)."""

    RETRY_FIRST_S = 0.1
    RETRY_MAX_S = 1.0

    def __init__(self, client: MemoryClient, *, save_within_s: float = 30.0, outbox: UsageOutbox | None = None):
        self._client = client  # its errors already name the memory service and its address
        self._save_within_s = save_within_s
        self._outbox = outbox

    async def load(self, session_id: str) -> list[ChatMessage]:
        try:
            messages = await self._client.transcript(session_id)
        except AgentmeshError as exc:
            raise type(exc)(f"could not read the session's transcript: {exc.message}") from None
        return [message_from_proto(m) for m in messages]

    async def append(self, session_id: str, messages: Sequence[ChatMessage]) -> None:
        # The model call that produced these messages handed its usage record over just before.
        carried = self._outbox.take(session_id) if self._outbox is not None else []
        try:
            usage_error = await self._append(
                session_id, messages, [usage_to_proto(held.entry) for held in carried if isinstance(held.entry, UsageEntry)],
                [call_to_proto(held.entry) for held in carried if isinstance(held.entry, RecordedCall)])
        except BaseException:
            usage_error = "the append failed"
            raise
        finally:
            for held in carried:
                held.settle(recorded=not usage_error)

    async def _append(self, session_id: str, messages: Sequence[ChatMessage],
                      usage: Sequence[memory_service_pb2.UsageRecord],
                      calls: Sequence[sessions_pb2.ModelCall] = ()) -> str:
        """Append (retried while memory is away); why `usage` was not recorded ('' when it was)."""
        batch = [message_to_proto(m) for m in messages]
        delay = self.RETRY_FIRST_S
        last: AgentmeshError | None = None
        try:
            async with asyncio.timeout(self._save_within_s):
                while True:
                    try:
                        if not usage and not calls:
                            await self._client.append_messages(session_id, batch)
                            return ""
                        reply = await self._client.append_with_usage(session_id, batch, usage, calls)
                        return reply.usage_error
                    except Unavailable as exc:
                        last = exc
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self.RETRY_MAX_S)
        except AgentmeshError as exc:
            raise type(exc)(f"could not save the session's transcript: {exc.message}") from None
        except TimeoutError:
            reason = last.message if last else "it did not answer"
            raise Unavailable(
                f"could not save the session's transcript within {self._save_within_s:g}s: {reason}"
            ) from None


class GrpcTurnStart:
    """StartTurn on the memory service: the transcript, the user's message appended after it and
    the turn's recall in one round trip instead of three. Retried while memory is away, like an
    append (GrpcTranscripts). The transcript each start read is kept (`kept`,
    kept_transcripts.py), and the next start asks only for what was appended after it."""

    PAGE = 1000

    def __init__(self, client: MemoryClient, target: str, *, save_within_s: float = 30.0,
                 kept: KeptTranscripts | None = None):
        self._client = client
        self._target = target
        self._save_within_s = save_within_s
        self._kept = kept if kept is not None else KeptTranscripts()

    async def start(self, session_id: str, first: Sequence[ChatMessage], *, namespace: str, query: str,
                    k: int, recall_timeout_s: float, learning: frozenset[str] = frozenset(),
                    opening: SessionToOpen | None = None) -> TurnBeginning:
        request = memory_service_pb2.StartTurnRequest(
            session_id=session_id, messages=[message_to_proto(m) for m in first], page_size=self.PAGE,
            namespace=namespace, recall_query=query, recall_k=k, recall_timeout_s=recall_timeout_s,
            with_profile=INSTRUCTIONS in learning, with_skills=SKILLS in learning,
            with_promoted_tools=PROMOTED_TOOLS in learning)
        if opening is not None:
            request.session.CopyFrom(_session_of(session_id, namespace, opening))
            request.agent = opening.agent
        kept = self._kept.get(session_id)
        if kept is not None and kept.through_seq:
            request.known_through_seq, request.known_generation = kept.through_seq, kept.generation
        try:
            # A turn that opens its session fails at once when memory is away, as the gateway's
            # PutSession did: nothing is shown to the client yet, who gets the status and resends.
            reply = await self._call(request, retry=opening is None)
            read, after, generation = list(reply.messages), reply.next_after_seq, reply.generation
            if reply.messages_after_seq and (kept is None or reply.messages_after_seq != kept.through_seq
                                             or reply.generation != kept.generation):
                # Not the tail of what this process holds (no memory service answers so): the
                # whole transcript, read again and not kept, rather than a copy not known right.
                kept, read, after, generation = None, [], -1, ""
            read += await self._rest(session_id, after, reply.first_seq)
        except AgentmeshError as exc:
            if opening is not None and isinstance(exc, SESSION_REFUSALS):
                raise  # memory's own sentence, as the client got it from the gateway's PutSession
            raise type(exc)(f"could not start the turn in the session's transcript: {exc.message}") from None
        hits = [MemoryHit(id=h.memory.id, text=h.memory.text, kind=h.memory.kind, score=h.score,
                          created_at=h.memory.created_at) for h in reply.recalled]
        learned = _learned(reply, learning) if learning and reply.learning_read else None
        opened = _opened(reply.session, reply.session_created, reply.namespace_settings,
                         reply.agent if reply.HasField("agent") else None) \
            if opening is not None and reply.HasField("session") else None
        tail = [message_from_proto(m) for m in read]
        if not reply.messages_after_seq:
            kept = None  # the whole transcript came back: what was kept is replaced
        if generation:
            stored = list(self._kept.put(session_id, generation, kept, tail).messages)
        else:  # a memory service that keeps no generations: nothing to ask a tail against
            self._kept.forget(session_id)
            stored = tail
        return TurnBeginning(stored, hits, reply.recall_error, learned, opened)

    async def _rest(self, session_id: str, after: int, first_seq: int) -> list[common_pb2.Message]:
        """What preceded the appended messages (seq < first_seq) after `after` (-1: from the
        start; 0: nothing more), read with ListMessages: a long transcript's further pages."""
        rest: list[common_pb2.Message] = []
        whole, after = after < 0, max(after, 0)
        while after or whole:
            whole = False
            page, after = await self._client.list_messages(session_id, after_seq=after, page_size=self.PAGE)
            rest += [m for m in page if m.seq < first_seq]
            if not page or page[-1].seq >= first_seq - 1:
                break
        return rest

    async def open(self, session_id: str, namespace: str, opening: SessionToOpen) -> OpenedSession:
        request = memory_service_pb2.PutSessionRequest(session=_session_of(session_id, namespace, opening),
                                               with_namespace_settings=True)
        try:
            reply = await self._client.stub.PutSession(request, timeout=self._save_within_s)
        except grpc.aio.AioRpcError as err:
            raise peer_error(err, f"the memory service at {self._target}") from None
        return _opened(reply.session, reply.created, reply.namespace_settings)

    async def _call(self, request: memory_service_pb2.StartTurnRequest, *, retry: bool = True) -> memory_service_pb2.StartTurnResponse:
        delay = GrpcTranscripts.RETRY_FIRST_S
        last: AgentmeshError | None = None
        try:
            async with asyncio.timeout(self._save_within_s):
                while True:
                    try:
                        # Carried on the agent's stream to memory when it can be (MemoryClient),
                        # retries too: a carried StartTurn is no likelier to have landed unseen
                        # than a unary one (docs/architecture.md, "Calls carried on a stream").
                        return await self._client.start_turn(request, self._save_within_s)
                    except grpc.aio.AioRpcError as err:
                        error = peer_error(err, f"the memory service at {self._target}")
                        if not retry or not isinstance(error, Unavailable):
                            raise error from None
                        last = error
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, GrpcTranscripts.RETRY_MAX_S)
        except TimeoutError:
            reason = last.message if last else f"the memory service at {self._target} did not answer"
            raise Unavailable(f"not done within {self._save_within_s:g}s: {reason}") from None


# How memory refuses to open a session (another tenant's id, a namespace not the caller's, an
# outage): passed on in memory's words, which the gateway answers the client with.
SESSION_REFUSALS = (NotFound, PermissionDenied, Unavailable, InvalidArgument)  # the last: a bad agent name


def _session_of(session_id: str, namespace: str, opening: SessionToOpen) -> sessions_pb2.Session:
    return sessions_pb2.Session(session_id=session_id, namespace=namespace, title=opening.title,
                                labels=opening.labels, created_at=opening.created_at,
                                updated_at=opening.created_at)


class MemoryNamedAgents:
    """The namespace's named agents as the memory service keeps them (GetAgent, ListAgents)."""

    def __init__(self, client: MemoryClient):
        self._client = client

    async def get(self, namespace: str, ref: str) -> NamedAgent:
        return named_agent(await self._client.get_agent(ref, namespace=namespace))

    async def list(self, namespace: str) -> list[NamedAgent]:
        return [named_agent(i) for i in await self._client.list_agents(namespace)]


def named_agent(info: agents_pb2.AgentInfo) -> NamedAgent:
    spec = info.spec
    return NamedAgent(name=spec.name, version=info.version, instructions=spec.instructions, model=spec.model,
                      description=spec.description, sub_agents=tuple(spec.sub_agents),
                      temperature=spec.temperature if spec.HasField("temperature") else None,
                      top_p=spec.top_p if spec.HasField("top_p") else None,
                      tools=ToolPolicy(tuple(spec.tools.allow), tuple(spec.tools.deny)),
                      permission_mode=spec.permission_mode, approvals=frozenset(spec.approvals),
                      max_steps=spec.max_steps, token_budget=spec.token_budget, skills=tuple(spec.skills),
                      mcp_servers=tuple(spec.mcp_servers),
                      sandbox_template=spec.sandbox_template, isolation=spec.isolation)


def _opened(session: sessions_pb2.Session, created: bool, settings: sessions_pb2.NamespaceSettings,
            agent: agents_pb2.AgentInfo | None = None) -> OpenedSession:
    return OpenedSession(
        agent=named_agent(agent) if agent is not None else None,
        namespace=session.namespace or "default", created=created, model=session.model,
        permission_mode=session.permission_mode,
        tools=ToolPolicy(tuple(session.tools.allow), tuple(session.tools.deny)),
        namespace_tools=ToolPolicy(tuple(settings.tools.allow), tuple(settings.tools.deny)),
        mcp_servers_version=settings.mcp_servers_version, namespace_sandbox_template=settings.sandbox_template,
        sandbox_template=session.sandbox_template, record_model_calls=session.record_model_calls,
        namespace_models=tuple(namespace_model(settings.namespace or session.namespace or "default", m)
                               for m in settings.models))


def namespace_model(namespace: str, m: sessions_pb2.NamespaceModel) -> ModelSpec:
    return ModelSpec(name=m.name, provider=m.provider, base_url=m.base_url, model=m.model,
                     context_window=m.context_window, max_output_tokens=m.max_output_tokens,
                     temperature=m.temperature if m.HasField("temperature") else None, fallback=m.fallback,
                     vision=not m.no_vision, input_price_per_mtok=m.input_price_per_mtok,
                     output_price_per_mtok=m.output_price_per_mtok, namespace=namespace,
                     api_key_secret=m.api_key_secret, api_key_secret_key=m.api_key_secret_key)


def _learned(reply: memory_service_pb2.StartTurnResponse, asked: frozenset[str]) -> Learned:
    errors = dict(reply.learning_errors)

    def read(part: str) -> bool:
        return part in asked and part not in errors

    return Learned(
        instructions=instructions_from_proto(reply.profile) if read(INSTRUCTIONS) else None,
        skills=[skill_summary_from_proto(s) for s in reply.skills] if read(SKILLS) else None,
        promoted_tools=[stored_tool_from_proto(t) for t in reply.promoted_tools] if read(PROMOTED_TOOLS) else None,
        errors=errors,
    )


class GrpcLongTermMemory:
    """Remember/Search on the memory service. UNIMPLEMENTED (an older memory service) becomes
    NotSupported, which the loop turns into a status note instead of a failed turn."""

    def __init__(self, client: MemoryClient, target: str, timeout_s: float):
        self._stub = client.stub
        self._target = target
        self._timeout_s = timeout_s

    def _error(self, err: grpc.aio.AioRpcError) -> AgentmeshError:
        if err.code() == grpc.StatusCode.UNIMPLEMENTED:
            return NotSupported("the memory service does not implement long-term memory yet")
        return peer_error(err, f"the memory service at {self._target}")

    @staticmethod
    def _hit(record: memory_service_pb2.MemoryRecord, score: float = 0.0) -> MemoryHit:
        return MemoryHit(id=record.id, text=record.text, kind=record.kind, score=score, created_at=record.created_at)

    async def remember(self, namespace: str, text: str, kind: str, source_session_id: str) -> MemoryHit:
        request = memory_service_pb2.RememberRequest(namespace=namespace, text=text, kind=kind, source_session_id=source_session_id)
        try:
            record = await self._stub.Remember(request, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as err:
            raise self._error(err) from None
        return self._hit(record)

    async def search(self, namespace: str, query: str, k: int) -> list[MemoryHit]:
        try:
            reply = await self._stub.Search(memory_service_pb2.SearchRequest(namespace=namespace, query=query, k=k), timeout=self._timeout_s)
        except grpc.aio.AioRpcError as err:
            raise self._error(err) from None
        return [self._hit(h.memory, h.score) for h in reply.hits]

    # Recall over conversations and memory blocks (capabilities/recall_tools.py's RecallSource).

    async def search_conversations(self, namespace: str, query: str, *, session_id: str, since: float,
                                   until: float, role: str) -> list[ConversationFound]:
        request = learning_pb2.SearchConversationsRequest(namespace=namespace, query=query, session_id=session_id,
                                                          since=since, until=until, role=role)
        try:
            reply = await self._stub.SearchConversations(request, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as err:
            raise self._error(err) from None

        def said(m: common_pb2.Message) -> str:
            return f"{m.role}: {m.content}" if m.role else ""

        return [ConversationFound(h.session_id, h.seq, h.role, h.text, h.created_at, h.score,
                                  said(h.before) if h.HasField("before") else "",
                                  said(h.after) if h.HasField("after") else "") for h in reply.hits]

    async def edit_block(self, namespace: str, name: str, change: str, text: str, old: str, *,
                         session_id: str, seq: int, model: str) -> BlockEdited:
        request = learning_pb2.EditBlockRequest(
            namespace=namespace, name=name, change=change, text=text, old=old,
            provenance=learning_pb2.BlockProvenance(session_id=session_id, seq=seq, model=model))
        try:
            reply = await self._stub.EditBlock(request, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as err:
            raise self._error(err) from None
        return BlockEdited(applied=reply.applied, version=reply.block.version, chars=len(reply.block.text),
                           max_chars=reply.block.max_chars, draft_id=reply.draft.id)


class GrpcUsageLog:
    """The usage ledger on the memory service (usage_log.py); one record per model call, sent
    with the session's next transcript append when one comes at once (UsageOutbox), else alone."""

    def __init__(self, client: MemoryClient, outbox: UsageOutbox | None = None):
        self._client = client
        self._outbox = outbox

    def record(self, entry: UsageEntry) -> "asyncio.Future[None]":
        if self._outbox is not None:
            return self._outbox.hold(entry, self._send_alone)
        return asyncio.ensure_future(self._send_alone(entry))

    async def _send_alone(self, entry: UsageEntry) -> None:
        await self._client.record_usage([usage_to_proto(entry)])
