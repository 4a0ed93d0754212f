"""The memory service's client, for the other services, the CLI and the benches.

    client = MemoryClient(open_channel(address, telemetry), address)
    await client.put_session("work", namespace="alice")
    await client.append_messages("work", [common_pb2.Message(role="user", content="hi")])
    await client.remember("Alice prefers tea", namespace="alice", kind="preference")
    hits = await client.search("what does alice drink", namespace="alice", k=5)

Failures arrive as `agentmesh.errors` exceptions (InvalidArgument, NotFound, Unavailable, ...)
carrying the server's sentence, so callers handle them like their own core errors.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import grpc
from opentelemetry import trace

from agentmesh.clients.base import DEFAULT_TIMEOUT_S, ServiceClient
from agentmesh.internal.v1 import memory_service_pb2, memory_service_pb2_grpc
from agentmesh.rpc.carried import CarriedClient, CarriedMethod, NotCarried
from agentmesh.rpc.convert import struct_from_dict
from agentmesh.rpc.identity import ServiceIdentity
from agentmesh.rpc.peers import peer_call
from agentmesh.v1 import agents_pb2, common_pb2, learning_pb2, sessions_pb2


def memory_filter(
    kinds: Iterable[str] = (),
    metadata: Mapping[str, Any] | None = None,
    created_after: float = 0.0,
    created_before: float = 0.0,
    source_session_id: str = "",
) -> memory_service_pb2.MemoryFilter:
    return memory_service_pb2.MemoryFilter(
        kinds=list(kinds),
        metadata=struct_from_dict(dict(metadata) if metadata else None),
        created_after=created_after,
        created_before=created_before,
        source_session_id=source_session_id,
    )


APPEND_METHOD = "/agentmesh.internal.v1.Memory/AppendMessages"
START_TURN_METHOD = "/agentmesh.internal.v1.Memory/StartTurn"


class MemoryClient(ServiceClient):
    """`carry` (identity and tracer of the calling service): AppendMessages and StartTurn calls
    ride one long-lived stream (`Memory.CarriedCalls`, agentmesh.rpc.carried) — for a caller
    that makes them on every turn and step, the agent; a request too large to carry goes as the
    unary call."""

    service = "memory"

    def __init__(self, channel: grpc.aio.Channel, target: str = "", *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 carry: tuple[ServiceIdentity | None, trace.Tracer | None] | None = None):
        super().__init__(channel, target, timeout_s=timeout_s)
        self._carrier: CarriedClient | None = None
        self._appends: CarriedMethod[memory_service_pb2.AppendMessagesRequest, memory_service_pb2.AppendMessagesResponse] | None = None
        self._starts: CarriedMethod[memory_service_pb2.StartTurnRequest, memory_service_pb2.StartTurnResponse] | None = None
        if carry is not None:
            identity, tracer = carry
            self._carrier = CarriedClient(self.stub.CarriedCalls, memory_service_pb2.CarriedMemoryCall,
                                          identity=identity, audience="memory", tracer=tracer, peer=self.peer)
            self._appends = self._carrier.method(APPEND_METHOD, "append_messages")
            self._starts = self._carrier.method(START_TURN_METHOD, "start_turn")

    def _make_stub(self, channel: grpc.aio.Channel) -> memory_service_pb2_grpc.MemoryStub:
        return memory_service_pb2_grpc.MemoryStub(channel)

    @property
    def carrying_appends(self) -> bool:
        """Whether appends ride the stream (False: a client made without `carry`)."""
        return self._appends is not None

    @property
    def carrying_turn_starts(self) -> bool:
        """Whether StartTurn calls ride the stream (False: a client made without `carry`)."""
        return self._starts is not None

    async def close(self) -> None:
        """Close the carried calls' stream (the channel is the caller's to close)."""
        if self._carrier is not None:
            await self._carrier.close()

    async def _append(self, request: memory_service_pb2.AppendMessagesRequest) -> memory_service_pb2.AppendMessagesResponse:
        if self._appends is not None:
            try:
                return await peer_call(self.peer, self._appends.call(request, self.timeout_s))
            except NotCarried:  # too large to carry
                pass
        return await self._call(self.stub.AppendMessages, request)

    async def start_turn(self, request: memory_service_pb2.StartTurnRequest, timeout: float) -> memory_service_pb2.StartTurnResponse:
        """One StartTurn, carried when it can be; its failure raised as grpc.aio.AioRpcError,
        as the unary call's (the caller tells outages from refusals and retries)."""
        if self._starts is not None:
            try:
                return await self._starts.call(request, timeout)
            except NotCarried:  # too large to carry
                pass
        return await self.stub.StartTurn(request, timeout=timeout)

    async def _call(self, method, request, timeout: float | None = None):
        return await self.call(method, request, timeout)

    # --- sessions ---

    async def put_session(
        self, session_id: str, *, title: str = "", namespace: str = "", labels: Mapping[str, str] | None = None
    ) -> tuple[sessions_pb2.Session, bool]:
        session = sessions_pb2.Session(
            session_id=session_id, title=title, namespace=namespace, labels=dict(labels or {})
        )
        reply = await self._call(self.stub.PutSession, memory_service_pb2.PutSessionRequest(session=session))
        return reply.session, reply.created

    async def get_session(self, session_id: str) -> sessions_pb2.Session:
        return await self._call(self.stub.GetSession, sessions_pb2.GetSessionRequest(session_id=session_id))

    async def list_sessions(self, page_size: int = 0, page_token: str = "") -> tuple[list[sessions_pb2.Session], str]:
        reply = await self._call(
            self.stub.ListSessions, sessions_pb2.ListSessionsRequest(page_size=page_size, page_token=page_token)
        )
        return list(reply.sessions), reply.next_page_token

    async def delete_session(self, session_id: str) -> bool:
        reply = await self._call(self.stub.DeleteSession, sessions_pb2.DeleteSessionRequest(session_id=session_id))
        return reply.deleted

    # --- transcripts ---

    async def append_messages(self, session_id: str, messages: Sequence[common_pb2.Message]) -> int:
        """Append in order; returns the seq of the last one (seqs are 1, 2, 3, ... per session)."""
        reply = await self._append(memory_service_pb2.AppendMessagesRequest(session_id=session_id, messages=list(messages)))
        return reply.last_seq

    async def append_with_usage(self, session_id: str, messages: Sequence[common_pb2.Message],
                                usage: Sequence[memory_service_pb2.UsageRecord],
                                model_calls: Sequence[sessions_pb2.ModelCall] = ()) -> memory_service_pb2.AppendMessagesResponse:
        """As append_messages, with usage records (and model calls' payloads) recorded in the same
        call (`usage_error` says why they were not; the messages are appended all the same)."""
        return await self._append(memory_service_pb2.AppendMessagesRequest(
            session_id=session_id, messages=list(messages), usage=list(usage), model_calls=list(model_calls)))

    async def list_messages(
        self, session_id: str, *, after_seq: int = 0, page_size: int = 0
    ) -> tuple[list[common_pb2.Message], int]:
        """One page after `after_seq`; the int is the next `after_seq`, 0 when the transcript ends."""
        reply = await self._call(
            self.stub.ListMessages,
            sessions_pb2.GetTranscriptRequest(session_id=session_id, page_size=page_size, after_seq=after_seq),
        )
        return list(reply.messages), reply.next_after_seq

    async def transcript(self, session_id: str, page_size: int = 1000) -> list[common_pb2.Message]:
        """The whole transcript, every page."""
        out: list[common_pb2.Message] = []
        after = 0
        while True:
            page, after = await self.list_messages(session_id, after_seq=after, page_size=page_size)
            out.extend(page)
            if not after:
                return out

    # --- usage ---

    async def record_usage(self, records: Sequence[memory_service_pb2.UsageRecord]) -> int:
        reply = await self._call(self.stub.RecordUsage, memory_service_pb2.RecordUsageRequest(records=list(records)))
        return reply.recorded

    # --- model calls' payloads ---

    async def record_model_calls(self, calls: Sequence[sessions_pb2.ModelCall]) -> int:
        reply = await self._call(self.stub.RecordModelCalls, memory_service_pb2.RecordModelCallsRequest(calls=list(calls)))
        return reply.recorded

    async def list_model_calls(self, session_id: str, run_id: str = "") -> list[sessions_pb2.ModelCall]:
        reply = await self._call(self.stub.ListModelCalls,
                                 sessions_pb2.ListModelCallsRequest(session_id=session_id, run_id=run_id))
        return list(reply.calls)

    # --- long-term memory ---

    async def remember(
        self,
        text: str,
        *,
        namespace: str = "default",
        kind: str = "",
        metadata: Mapping[str, Any] | None = None,
        id: str = "",
        source_session_id: str = "",
        created_at: float = 0.0,
    ) -> memory_service_pb2.MemoryRecord:
        request = memory_service_pb2.RememberRequest(
            namespace=namespace,
            text=text,
            kind=kind,
            metadata=struct_from_dict(dict(metadata) if metadata else None),
            id=id,
            source_session_id=source_session_id,
            created_at=created_at,
        )
        return await self._call(self.stub.Remember, request)

    async def search(
        self, query: str, *, namespace: str = "default", k: int = 0, filter: memory_service_pb2.MemoryFilter | None = None
    ) -> list[memory_service_pb2.SearchHit]:
        request = memory_service_pb2.SearchRequest(namespace=namespace, query=query, k=k, filter=filter)
        return list((await self._call(self.stub.Search, request)).hits)

    async def get_memory(self, memory_id: str, *, namespace: str = "default") -> memory_service_pb2.MemoryRecord:
        return await self._call(self.stub.GetMemory, memory_service_pb2.GetMemoryRequest(namespace=namespace, id=memory_id))

    async def list_memories(
        self,
        *,
        namespace: str = "default",
        filter: memory_service_pb2.MemoryFilter | None = None,
        page_size: int = 0,
        page_token: str = "",
    ) -> tuple[list[memory_service_pb2.MemoryRecord], str]:
        request = memory_service_pb2.ListMemoriesRequest(
            namespace=namespace, filter=filter, page_size=page_size, page_token=page_token
        )
        reply = await self._call(self.stub.ListMemories, request)
        return list(reply.memories), reply.next_page_token

    async def forget(
        self,
        *,
        namespace: str = "default",
        ids: Sequence[str] = (),
        filter: memory_service_pb2.MemoryFilter | None = None,
        all: bool = False,
    ) -> int:
        request = memory_service_pb2.ForgetRequest(namespace=namespace, ids=list(ids), filter=filter, all=all)
        return (await self._call(self.stub.Forget, request)).forgotten

    async def import_memories(
        self, memories: Sequence[memory_service_pb2.RememberRequest], *, namespace: str = "default", timeout_s: float = 300.0
    ) -> int:
        request = memory_service_pb2.ImportRequest(namespace=namespace, memories=list(memories))
        return (await self._call(self.stub.Import, request, timeout=timeout_s)).imported

    # --- standing instructions ---

    async def get_profile(self, namespace: str = "default") -> learning_pb2.Profile:
        return await self._call(self.stub.GetProfile, learning_pb2.GetProfileRequest(namespace=namespace))

    async def set_profile(self, part: str, text: str, *, namespace: str = "default") -> learning_pb2.Profile:
        return await self._call(self.stub.SetProfile, learning_pb2.SetProfileRequest(namespace=namespace, part=part, text=text))

    # --- named agents ---

    async def get_agent(self, ref: str, *, namespace: str = "default") -> agents_pb2.AgentInfo:
        return await self._call(self.stub.GetAgent, agents_pb2.GetAgentRequest(namespace=namespace, name=ref))

    async def list_agents(self, namespace: str = "default") -> list[agents_pb2.AgentInfo]:
        return list((await self._call(self.stub.ListAgents, agents_pb2.ListAgentsRequest(namespace=namespace))).agents)

    # --- skills ---

    async def list_skills(self, namespace: str = "default", include_drafts: bool = False) -> list[learning_pb2.SkillInfo]:
        request = learning_pb2.ListSkillsRequest(namespace=namespace, include_drafts=include_drafts)
        return list((await self._call(self.stub.ListSkills, request)).skills)

    async def get_skill(self, name: str, *, namespace: str = "default", version: int = 0) -> learning_pb2.Skill:
        return await self._call(self.stub.GetSkill, learning_pb2.GetSkillRequest(namespace=namespace, name=name, version=version))

    # --- promoted tools ---

    async def put_promoted_tool(self, tool: learning_pb2.PromotedTool) -> learning_pb2.PromotedTool:
        return await self._call(self.stub.PutPromotedTool, tool)

    async def list_promoted_tools(self, namespace: str = "default") -> list[learning_pb2.PromotedTool]:
        reply = await self._call(self.stub.ListPromotedTools, learning_pb2.ListPromotedToolsRequest(namespace=namespace))
        return list(reply.tools)

    # --- reflection ---

    async def reflection_state(self, session_id: str, *, namespace: str = "default") -> memory_service_pb2.ReflectionState:
        request = memory_service_pb2.GetReflectionStateRequest(namespace=namespace, session_id=session_id)
        return await self._call(self.stub.GetReflectionState, request)

    async def record_reflection(self, run: learning_pb2.ReflectionRun) -> memory_service_pb2.ReflectionState:
        return await self._call(self.stub.RecordReflection, run)

    async def put_skill(self, request: learning_pb2.PutSkillRequest) -> learning_pb2.SkillInfo:
        return await self._call(self.stub.PutSkill, request)

    # --- teams (docs/teams.md) ---

    async def swap_team_record(self, record: memory_service_pb2.TeamRecord) -> memory_service_pb2.SwapTeamRecordResponse:
        """Write `record` if the stored one is at `record.version` (0: none yet)."""
        return await self._call(self.stub.SwapTeamRecord, record)

    async def list_team_records(self, namespace: str, team: str, kind: str) -> list[memory_service_pb2.TeamRecord]:
        request = memory_service_pb2.ListTeamRecordsRequest(namespace=namespace, team=team, kind=kind)
        return list((await self._call(self.stub.ListTeamRecords, request)).records)

    async def wait_team(self, namespace: str, team: str, after: int, timeout_s: float) -> int:
        request = memory_service_pb2.WaitTeamRequest(namespace=namespace, team=team, after=after, timeout_s=timeout_s)
        return (await self._call(self.stub.WaitTeam, request, timeout_s + 10.0)).change
