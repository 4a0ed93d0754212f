"""gRPC adapter of the memory service: proto <-> core types, nothing else."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Awaitable, Callable

from structlog.contextvars import bound_contextvars

from agentmesh.errors import AgentmeshError, FailedPrecondition, InvalidArgument
from agentmesh.internal.v1 import memory_service_pb2, memory_service_pb2_grpc
from agentmesh.logs import get_logger
from agentmesh.memory.a2a_tasks import A2aTasks
from agentmesh.memory.agent_rpcs import AgentRpcs, agent_info_to_proto
from agentmesh.memory.agents import Agents
from agentmesh.memory.blocks import Blocks
from agentmesh.memory.convert import (
    add_messages,
    filter_from_proto,
    memory_to_proto,
    message_from_proto,
    model_from_proto,
    namespace_to_proto,
    remember_from_proto,
    session_changes,
    session_from_proto,
    session_to_proto,
)
from agentmesh.memory.learning_rpcs import LearningRpcs, profile_to_proto, promoted_to_proto, skill_info_to_proto
from agentmesh.memory.mcp_registry import McpRegistration, McpRegistry
from agentmesh.memory.memories import Memories
from agentmesh.memory.model_call_rpcs import ModelCallRpcs, carried_calls
from agentmesh.memory.model_calls import ModelCalls
from agentmesh.memory.namespaces import Namespaces
from agentmesh.memory.profiles import Profiles
from agentmesh.memory.promoted import PromotedTools
from agentmesh.memory.recall import ConversationIndex
from agentmesh.memory.recall_rpcs import RecallRpcs, block_to_proto, block_user
from agentmesh.memory.reflections import Reflections
from agentmesh.memory.retention import Retention
from agentmesh.memory.retention_rpcs import RetentionRpcs, creator
from agentmesh.memory.run_rpcs import RunRecordRpcs
from agentmesh.memory.runs import Runs, WebhookSecrets
from agentmesh.memory.skills import Skills
from agentmesh.memory.team_rpcs import TeamRpcs
from agentmesh.memory.teams import TeamRecords
from agentmesh.memory.tenancy import TenantGuard
from agentmesh.memory.transcript_records import SessionRecord
from agentmesh.memory.transcripts import Transcripts
from agentmesh.memory.turns import Recall, start_turn
from agentmesh.memory.usage import UsageLedger, UsageRecord
from agentmesh.rpc.audit import AuditLog
from agentmesh.rpc.calls import ServerCalls
from agentmesh.rpc.carried import CARRY_LIMIT_BYTES, ServedMethod, oneof_answers
from agentmesh.rpc.carried import CarriedCalls as CallCarrier  # the servicer has a method of that name
from agentmesh.rpc.errors import translate_errors
from agentmesh.v1 import sessions_pb2

log = get_logger("agentmesh.memory")

APPEND_METHOD = "/agentmesh.internal.v1.Memory/AppendMessages"
START_TURN_METHOD = "/agentmesh.internal.v1.Memory/StartTurn"


class MemoryServicer(LearningRpcs, AgentRpcs, RecallRpcs, RunRecordRpcs, TeamRpcs, RetentionRpcs, ModelCallRpcs,
                     memory_service_pb2_grpc.MemoryServicer):
    def __init__(self, transcripts: Transcripts, memories: Memories, namespaces: Namespaces, profiles: Profiles,
                 skills: Skills, promoted: PromotedTools, reflections: Reflections,
                 usage: UsageLedger, audit: AuditLog | None = None, mcp_registry: McpRegistry | None = None,
                 a2a_tasks: A2aTasks | None = None, agents: Agents | None = None, blocks: Blocks | None = None,
                 conversations: ConversationIndex | None = None, runs: Runs | None = None,
                 webhook_secrets: WebhookSecrets | None = None, retention: Retention | None = None,
                 teams: TeamRecords | None = None):
        self._transcripts = transcripts
        self._agents = agents
        self._blocks, self._conversations = blocks, conversations  # recall_rpcs.py
        self._retention = retention  # type: ignore[assignment]  # None: tests that sweep nothing
        self.carried_appends: CallCarrier | None = None  # set by carry()
        self.carried_calls: CallCarrier | None = None  # set by carry()
        self._mcp = mcp_registry
        self._a2a_tasks = a2a_tasks
        self._runs = runs
        self._team_records = teams  # team_rpcs.py
        self._webhook_secrets = webhook_secrets
        self._memories = memories
        self._namespaces = namespaces
        self._profiles = profiles
        self._skills = skills
        self._promoted = promoted
        self._reflections = reflections
        # Memory keeps tenants apart itself, whoever calls: a session or namespace outside the
        # principal's tenants is NOT_FOUND / PERMISSION_DENIED here too, not only at the gateway.
        self._tenants = TenantGuard(transcripts, audit)
        self._usage = usage
        self._model_calls = ModelCalls(transcripts.store)

    # --- sessions ---

    async def _put_session(self, session: sessions_pb2.Session) -> tuple[SessionRecord, bool]:
        await self._tenants.may_put(session.session_id, session.namespace)
        return await self._transcripts.put_session(replace(session_from_proto(session), created_by=creator()))

    @translate_errors
    async def PutSession(self, request, context):
        session, created = await self._put_session(request.session)
        reply = memory_service_pb2.PutSessionResponse(session=session_to_proto(session), created=created)
        if request.with_namespace_settings:
            # The session's namespace as stored (an existing session keeps its own), checked as
            # GetNamespaceSettings is.
            namespace = session.namespace or "default"
            self._tenants.namespace(namespace, "GetNamespaceSettings")
            reply.namespace_settings.CopyFrom(namespace_to_proto(await self._namespaces.get(namespace)))
        return reply

    @translate_errors
    async def GetSession(self, request, context):
        return session_to_proto(await self._tenants.session(request.session_id, "GetSession"))

    @translate_errors
    async def ListSessions(self, request, context):
        sessions, token = await self._transcripts.list_sessions(request.page_size, request.page_token,
                                                                self._tenants.visible_namespaces())
        return sessions_pb2.ListSessionsResponse(sessions=[session_to_proto(s) for s in sessions], next_page_token=token)

    @translate_errors
    async def DeleteSession(self, request, context):
        await self._tenants.session_if_any(request.session_id, "DeleteSession")
        with bound_contextvars(session_id=request.session_id):
            tree = await self._retention.session_tree(request.session_id) if self._retention is not None else []
            deleted = await self._transcripts.delete_session(request.session_id)
            if deleted and self._retention is not None:
                await self._retention.forget_conversations(tree)
        return sessions_pb2.DeleteSessionResponse(deleted=deleted)

    # --- transcripts ---

    @translate_errors
    async def AppendMessages(self, request, context):
        return await self.append_messages(request)

    def AppendStream(self, request_iterator, context):
        """AppendMessages calls carried on one stream (agentmesh.rpc.carried), each served as
        the unary call is: checked, traced and measured as one. Today's agents carry them on
        CarriedCalls; this serves agents from before it."""
        if self.carried_appends is None:
            raise NotImplementedError("AppendStream needs carry()")
        return self.carried_appends.serve(request_iterator)

    def CarriedCalls(self, request_iterator, context):
        """AppendMessages and StartTurn calls carried on one stream (agentmesh.rpc.carried),
        each served as its unary call is: checked, traced and measured as one."""
        if self.carried_calls is None:
            raise NotImplementedError("CarriedCalls needs carry()")
        return self.carried_calls.serve(request_iterator)

    def carry(self, calls: ServerCalls) -> list[CallCarrier]:
        """Serve the carried calls' streams through `calls`; the streams to close on drain."""
        append = ServedMethod(APPEND_METHOD, self.append_messages)
        self.carried_appends = CallCarrier(
            calls, {"append_messages": append},
            unwrap=lambda message: (message.call, "append_messages", message.request),
            wrap=lambda status, field, response: memory_service_pb2.AppendStreamResponse(status=status, response=response))
        self.carried_calls = CallCarrier(
            calls, {"append_messages": append, "start_turn": ServedMethod(START_TURN_METHOD, self.start_turn_carried)},
            wrap=oneof_answers(memory_service_pb2.CarriedMemoryAnswer))
        return [self.carried_appends, self.carried_calls]

    async def append_messages(self, request: memory_service_pb2.AppendMessagesRequest) -> memory_service_pb2.AppendMessagesResponse:
        """AppendMessages' work, for the unary call and for each call carried on AppendStream."""
        await self._tenants.session_if_any(request.session_id, "AppendMessages")
        messages = [message_from_proto(m) for m in request.messages]
        with bound_contextvars(session_id=request.session_id):
            last = await self._transcripts.append_messages(request.session_id, messages)
        self._appended(request.session_id)
        reply = memory_service_pb2.AppendMessagesResponse(last_seq=last)
        if request.usage or request.model_calls:
            # After the append, which has happened whatever becomes of these: a refused or
            # failed record is a sentence for the caller to act on, never a failed append.
            try:
                if request.usage:
                    await self._usage.record(_usage_records(request.usage))
                if request.model_calls:
                    await self._model_calls.record(carried_calls(request.session_id, request.model_calls))
            except AgentmeshError as exc:
                reply.usage_error = exc.message
            except Exception as exc:
                log.exception("usage records sent with an append not recorded")
                reply.usage_error = f"{type(exc).__name__}: {exc}"
        return reply

    @translate_errors
    async def UpdateSession(self, request, context):
        await self._tenants.session_if_any(request.session_id, "UpdateSession")
        with bound_contextvars(session_id=request.session_id):
            return session_to_proto(await self._transcripts.update_session(request.session_id, session_changes(request)))

    @translate_errors
    async def ClearTranscript(self, request, context):
        await self._tenants.session_if_any(request.session_id, "ClearTranscript")
        with bound_contextvars(session_id=request.session_id):
            cleared = await self._transcripts.clear_transcript(request.session_id)
        return sessions_pb2.ClearTranscriptResponse(cleared=cleared)

    # --- namespaces ---

    @translate_errors
    async def GetNamespaceSettings(self, request, context):
        self._tenants.namespace(request.namespace, "GetNamespaceSettings")
        return namespace_to_proto(await self._namespaces.get(request.namespace))

    @translate_errors
    async def UpdateNamespaceSettings(self, request, context):
        self._tenants.namespace(request.namespace, "UpdateNamespaceSettings")
        r = request.retention
        days = (r.transcripts_days, r.memories_days, r.usage_days, r.workspaces_days)
        record = await self._namespaces.update(request.namespace, list(request.tools.allow), list(request.tools.deny),
                                               days if request.HasField("retention") else None,
                                               request.sandbox_template if request.HasField("sandbox_template") else None,
                                               [model_from_proto(m) for m in request.models.models]
                                               if request.HasField("models") else None)
        if self._retention is not None:
            await self._retention.note(record)
        return namespace_to_proto(record)

    @translate_errors
    async def DropRun(self, request, context):
        await self._tenants.session_if_any(request.session_id, "DropRun")
        with bound_contextvars(session_id=request.session_id, run_id=request.run_id):
            dropped = await self._transcripts.drop_run(request.session_id, request.run_id)
        return memory_service_pb2.DropRunResponse(dropped=dropped)

    @translate_errors
    async def StartTurn(self, request, context):
        return await self.start_turn(request)

    async def start_turn_carried(self, request: memory_service_pb2.StartTurnRequest) -> memory_service_pb2.StartTurnResponse:
        """StartTurn carried on a stream: its answer bounded as a carried request is
        (CARRY_LIMIT_BYTES) — a long transcript would hold every other answer on the stream
        behind it. What does not fit is left for the caller to page with ListMessages, as it
        pages a transcript longer than page_size (next_after_seq)."""
        return bound_transcript(await self.start_turn(request), CARRY_LIMIT_BYTES)

    async def start_turn(self, request: memory_service_pb2.StartTurnRequest) -> memory_service_pb2.StartTurnResponse:
        """StartTurn's work, for the unary call and for each call carried on CarriedCalls."""
        namespace, opened, settings, resolved = request.namespace, None, None, None
        if request.HasField("session"):
            # The session first, as PutSession (the gateway no longer calls it before the turn):
            # the turn then runs in the namespace the session is stored in.
            if request.session.session_id != request.session_id:
                raise InvalidArgument("session.session_id must be the session_id the turn starts in")
            # The named agent before the session is put: a bad name refuses the turn with nothing
            # written. (Without one, the session's namespace is not looked up here: the put says it.)
            if request.agent:
                resolved = await self._resolve_agent(request, await self._namespace_to_be(request.session))
            opened = await self._put_session(request.session)
            namespace = opened[0].namespace or "default"
            self._tenants.namespace(namespace, "GetNamespaceSettings")
            settings = await self._namespaces.get(namespace)  # in-process and quick: no task of its own
        else:
            await self._tenants.session_if_any(request.session_id, "StartTurn")
            resolved = await self._resolve_agent(request, namespace)
        agent = await self._record_agent(request, resolved)
        if request.recall_k:
            self._tenants.namespace(namespace, "Search")
        messages = [message_from_proto(m) for m in request.messages]
        recall = Recall(namespace, request.recall_query, request.recall_k, request.recall_timeout_s)
        with bound_contextvars(session_id=request.session_id):
            started = await start_turn(self._transcripts, self._memories, request.session_id, messages,
                                       request.page_size, recall if request.recall_k else None,
                                       self._learning_reads(request, namespace),
                                       request.known_through_seq, request.known_generation)
        if messages:
            self._appended(request.session_id)
        reply = memory_service_pb2.StartTurnResponse(
            next_after_seq=started.next_after_seq,
            first_seq=started.first_seq,
            last_seq=started.last_seq,
            recalled=[memory_service_pb2.SearchHit(memory=memory_to_proto(h.memory), score=h.score) for h in started.recalled],
            recall_error=started.recall_error,
            learning_read=True,
            learning_errors=started.learning_errors,
            messages_after_seq=started.after_seq, generation=started.generation,
        )
        add_messages(reply.messages, started.transcript)
        learned = started.learned
        if "profile" in learned:
            reply.profile.CopyFrom(profile_to_proto(learned["profile"]))
            # The namespace's memory blocks ride with its standing instructions, in prompt order.
            reply.profile.blocks.extend(block_to_proto(b) for b in learned.get("blocks", ()))
        reply.skills.extend(skill_info_to_proto(i) for i in learned.get("skills", ()))
        reply.promoted_tools.extend(promoted_to_proto(t) for t in learned.get("promoted_tools", ()))
        if agent is not None:
            reply.agent.CopyFrom(agent_info_to_proto(agent[0]))
            opened = (agent[1], opened[1]) if opened is not None else None
        if opened is not None and settings is not None:
            reply.session.CopyFrom(session_to_proto(opened[0]))
            reply.session_created = opened[1]
            reply.namespace_settings.CopyFrom(namespace_to_proto(settings))
        return reply

    def _learning_reads(self, request: memory_service_pb2.StartTurnRequest,
                        namespace: str) -> dict[str, Callable[[], Awaitable[Any]]]:
        """The learning parts StartTurn was asked for, each checked as its own RPC would be."""
        namespace = namespace or "default"

        def checked(method: str, read: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[Any]]:
            async def run() -> Any:
                self._tenants.namespace(namespace, method)
                return await read()
            return run

        reads: dict[str, Callable[[], Awaitable[Any]]] = {}
        if request.with_profile:
            reads["profile"] = checked("GetProfile", lambda: self._profiles.get(namespace))
            if (blocks := self._blocks) is not None:
                # The person chatting sees their own per-user blocks (blocks.py), read
                # while the call's principal is theirs.
                user = block_user()
                reads["blocks"] = checked("ListBlocks", lambda: blocks.list(namespace, user))
        if request.with_skills:
            reads["skills"] = checked("ListSkills", lambda: self._skills.list(namespace))
        if request.with_promoted_tools:
            reads["promoted_tools"] = checked("ListPromotedTools", lambda: self._promoted.list(namespace))
        return reads

    @translate_errors
    async def ListMessages(self, request, context):
        await self._tenants.session_if_any(request.session_id, "ListMessages")
        with bound_contextvars(session_id=request.session_id):
            messages, next_after = await self._transcripts.list_messages(
                request.session_id, request.page_size, request.after_seq
            )
        reply = sessions_pb2.GetTranscriptResponse(next_after_seq=next_after)
        add_messages(reply.messages, messages)
        return reply

    # --- long-term memory ---

    @translate_errors
    async def Remember(self, request, context):
        self._tenants.namespace(request.namespace, "Remember")
        item = replace(remember_from_proto(request), created_by=creator())
        return memory_to_proto(await self._memories.remember(item))

    @translate_errors
    async def Search(self, request, context):
        self._tenants.namespace(request.namespace, "Search")
        hits = await self._memories.search(
            request.namespace, request.query, request.k, filter_from_proto(request.filter)
        )
        return memory_service_pb2.SearchResponse(
            hits=[memory_service_pb2.SearchHit(memory=memory_to_proto(h.memory), score=h.score) for h in hits]
        )

    @translate_errors
    async def GetMemory(self, request, context):
        self._tenants.namespace(request.namespace, "GetMemory")
        return memory_to_proto(await self._memories.get(request.namespace, request.id))

    @translate_errors
    async def ListMemories(self, request, context):
        self._tenants.namespace(request.namespace, "ListMemories")
        reply = memory_service_pb2.ListMemoriesResponse(embedder=self._memories.embedder_id)
        if request.with_vectors:
            found, reply.next_page_token = await self._memories.list_with_vectors(
                request.namespace, filter_from_proto(request.filter), request.page_size, request.page_token)
            for m, vector in found:
                reply.memories.append(memory_to_proto(m))
                reply.memories[-1].vector.extend(vector)
            return reply
        memories, reply.next_page_token = await self._memories.list(
            request.namespace, filter_from_proto(request.filter), request.page_size, request.page_token
        )
        reply.memories.extend(memory_to_proto(m) for m in memories)
        return reply

    @translate_errors
    async def Forget(self, request, context):
        self._tenants.namespace(request.namespace, "Forget")
        has_filter = request.HasField("filter")
        forgotten = await self._memories.forget(
            request.namespace,
            ids=list(request.ids),
            memory_filter=filter_from_proto(request.filter) if has_filter else None,
            forget_all=request.all,
        )
        return memory_service_pb2.ForgetResponse(forgotten=forgotten)

    @translate_errors
    async def Import(self, request, context):
        items = [replace(remember_from_proto(m, default_namespace=request.namespace), created_by=creator())
                 for m in request.memories]
        for namespace in {request.namespace, *(item.namespace for item in items)}:
            self._tenants.namespace(namespace, "Import")
        imported = await self._memories.import_many(request.namespace, items, request.embedder)
        return memory_service_pb2.ImportResponse(imported=imported)

    # --- usage ---

    @translate_errors
    async def RecordUsage(self, request, context):
        return memory_service_pb2.RecordUsageResponse(recorded=await self._usage.record(_usage_records(request.records)))

    @translate_errors
    async def SumUsage(self, request, context):
        sums, count = await self._usage.sums(request.start, request.end, request.group_by)
        return memory_service_pb2.SumUsageResponse(
            sums=[memory_service_pb2.UsageSum(key=s.key, model_name=s.model_name, calls=s.calls, input_tokens=s.input_tokens,
                                      output_tokens=s.output_tokens, cached_input_tokens=s.cached_input_tokens,
                                      fallback_calls=s.fallback_calls, namespace=s.namespace) for s in sums],
            records=count,
        )
    # --- a namespace's own MCP servers (mcp_registry.py) ---

    def _registry(self) -> McpRegistry:
        if self._mcp is None:
            raise FailedPrecondition("this memory service keeps no MCP server registrations")
        return self._mcp

    async def _registrations(self, namespace: str, version: float) -> memory_service_pb2.McpRegistrations:
        servers, _ = await self._registry().list(namespace)
        return memory_service_pb2.McpRegistrations(namespace=namespace or "default", version=version,
                                           servers=[_registration_to_proto(s) for s in servers])

    @translate_errors
    async def ListMcpRegistrations(self, request, context):
        self._tenants.namespace(request.namespace or "default", "ListMcpRegistrations")
        servers, version = await self._registry().list(request.namespace)
        return memory_service_pb2.McpRegistrations(namespace=request.namespace or "default", version=version,
                                           servers=[_registration_to_proto(s) for s in servers])

    @translate_errors
    async def PutMcpRegistration(self, request, context):
        self._tenants.namespace(request.namespace or "default", "PutMcpRegistration")
        version = await self._registry().put(request.namespace, _registration_from_proto(request.server),
                                             only_if_absent=request.only_if_absent)
        return await self._registrations(request.namespace, version)

    @translate_errors
    async def RemoveMcpRegistration(self, request, context):
        self._tenants.namespace(request.namespace or "default", "RemoveMcpRegistration")
        version = await self._registry().remove(request.namespace, request.name)
        return await self._registrations(request.namespace, version)

    # --- A2A tasks (a2a_tasks.py) ---

    def _tasks(self) -> A2aTasks:
        if self._a2a_tasks is None:
            raise FailedPrecondition("this memory service keeps no A2A tasks")
        return self._a2a_tasks

    @translate_errors
    async def PutA2aTask(self, request, context):
        self._tenants.namespace(request.namespace or "default", "PutA2aTask")
        created = await self._tasks().put(request.namespace, request.task_id, request.task_json)
        return memory_service_pb2.PutA2aTaskResponse(created=created)

    @translate_errors
    async def GetA2aTask(self, request, context):
        self._tenants.namespace(request.namespace or "default", "GetA2aTask")
        task_json, updated_at = await self._tasks().get(request.namespace, request.task_id)
        return memory_service_pb2.A2aTaskRecord(namespace=request.namespace or "default", task_id=request.task_id,
                                        task_json=task_json, updated_at=updated_at)


def _registration_to_proto(s: McpRegistration) -> memory_service_pb2.McpRegistration:
    return memory_service_pb2.McpRegistration(name=s.name, command=s.command, args=list(s.args), url=s.url,
                                      headers=dict(s.headers), env_secrets=dict(s.env_secrets),
                                      header_secrets=dict(s.header_secrets), added_at=s.added_at)


def _registration_from_proto(m: memory_service_pb2.McpRegistration) -> McpRegistration:
    return McpRegistration(name=m.name, command=m.command, args=tuple(m.args), url=m.url, headers=dict(m.headers),
                           env_secrets=dict(m.env_secrets), header_secrets=dict(m.header_secrets), added_at=m.added_at)


def bound_transcript(reply: memory_service_pb2.StartTurnResponse, limit_bytes: int) -> memory_service_pb2.StartTurnResponse:
    """`reply` with as much of its transcript page as keeps it within `limit_bytes` (at least
    one message), and next_after_seq where the rest starts."""
    if reply.ByteSize() <= limit_bytes or len(reply.messages) <= 1:
        return reply
    room = limit_bytes - (reply.ByteSize() - sum(m.ByteSize() + 8 for m in reply.messages))
    kept = 1
    room -= reply.messages[0].ByteSize() + 8
    while kept < len(reply.messages) and room - (reply.messages[kept].ByteSize() + 8) >= 0:
        room -= reply.messages[kept].ByteSize() + 8
        kept += 1
    if kept < len(reply.messages):
        reply.next_after_seq = reply.messages[kept - 1].seq
        del reply.messages[kept:]
    return reply


def _usage_records(records) -> list[UsageRecord]:
    return [
        UsageRecord(
            id=r.id, at=r.at, session_id=r.session_id, run_id=r.run_id, namespace=r.namespace,
            model_name=r.model_name, model=r.model, provider=r.provider, input_tokens=r.input_tokens,
            output_tokens=r.output_tokens, cached_input_tokens=r.cached_input_tokens, fallback=r.fallback,
            purpose=r.purpose, root_session_id=r.root_session_id,
        )
        for r in records
    ]
