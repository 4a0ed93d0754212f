"""The loop's ports over gRPC: the tools service (catalog, sandboxed execution) and the memory
service (transcripts, long-term memory, the usage ledger). Protobuf stops here; the core sees `types`."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Sequence, cast

import grpc

from agentmesh.agent.ports import BackgroundCheck, MemoryHit, NotSupported, TurnBeginning
from agentmesh.agent.types import BackgroundDone, ChatMessage, Role, ToolCall, ToolOutcome, ToolSpec
from agentmesh.agent.usage_log import UsageEntry
from agentmesh.errors import AgentmeshError, Unavailable
from agentmesh.memory.client import MemoryClient
from agentmesh.rpc.convert import tool_result_from_proto, tool_spec_from_proto
from agentmesh.rpc.peers import OUTAGE, peer_error, rpc_detail
from agentmesh.telemetry.propagation import trace_metadata
from agentmesh.v1 import common_pb2, memory_pb2, tools_pb2, tools_pb2_grpc

_ERROR_KINDS = {
    grpc.StatusCode.INVALID_ARGUMENT: "invalid_arguments",
    grpc.StatusCode.NOT_FOUND: "not_found",
    grpc.StatusCode.PERMISSION_DENIED: "denied",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "resource_exhausted",
    grpc.StatusCode.FAILED_PRECONDITION: "failed_precondition",
}


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
    )


def message_from_proto(m: common_pb2.Message) -> ChatMessage:
    role = cast(Role, m.role) if m.role in ("system", "user", "assistant", "tool") else "user"
    return ChatMessage(
        role=role,
        content=m.content,
        tool_calls=tuple(ToolCall(c.call_id, c.name, c.arguments_json or "{}") for c in m.tool_calls),
        tool_call_id=m.tool_call_id,
        name=m.name,
        run_id=m.run_id,
        seq=m.seq,
        kind=m.kind,
        covers_through_seq=m.covers_through_seq,
    )


# --- tools ----------------------------------------------------------------------------------


class GrpcToolRunner:
    """Tools over a channel *without* the tracing client interceptor: that interceptor awaits
    the call's status inside its own task, so cancelling a call through it never reaches the
    server (opentelemetry-instrumentation-grpc 0.5x). Trace context is injected by hand instead;
    the execute_tool span is the parent of the tools service's spans."""

    def __init__(self, channel: grpc.aio.Channel, target: str, *, timeout_s: float, catalog_timeout_s: float = 10.0):
        self._stub = tools_pb2_grpc.ToolsStub(channel)
        self._target = target
        self._timeout_s = timeout_s
        self._catalog_timeout_s = catalog_timeout_s

    async def list_tools(self, namespace: str = "", *, mcp_version: float | None = None) -> list[ToolSpec]:
        try:
            reply = await self._stub.ListTools(
                tools_pb2.ListToolsRequest(namespace=namespace, mcp_servers_version=mcp_version),
                timeout=self._catalog_timeout_s, metadata=trace_metadata()
            )
        except grpc.aio.AioRpcError as err:
            raise Unavailable(f"the tools service at {self._target} did not list its tools ({rpc_detail(err)})") from None
        return [tool_spec_from_proto(s) for s in reply.tools]

    async def execute(self, session_id: str, call: ToolCall, namespace: str = "", *,
                      mcp_version: float | None = None) -> ToolOutcome:
        request = tools_pb2.ExecuteRequest(session_id=session_id, call_id=call.call_id, name=call.name,
                                           arguments_json=call.arguments_json, namespace=namespace,
                                           mcp_servers_version=mcp_version)
        rpc = self._stub.Execute(request, timeout=self._timeout_s, metadata=trace_metadata())
        try:
            reply = await rpc
        except asyncio.CancelledError:
            rpc.cancel()  # the tools service sees the cancellation and kills the sandboxed process
            raise
        except grpc.aio.AioRpcError as err:
            detail = rpc_detail(err)
            if err.code() in OUTAGE:
                return ToolOutcome.error(
                    call, "sandbox_unavailable", f"error: the tools service at {self._target} is not answering ({detail})"
                )
            return ToolOutcome.error(call, _ERROR_KINDS.get(err.code(), "tool_error"), f"error: {detail}")
        return replace(tool_result_from_proto(reply.result), call_id=call.call_id, name=call.name)


class GrpcBackgroundCommands:
    """BackgroundResults / StopBackground on the tools service."""

    def __init__(self, channel: grpc.aio.Channel, target: str, *, timeout_s: float = 10.0):
        self._stub = tools_pb2_grpc.ToolsStub(channel)
        self._target = target
        self._timeout_s = timeout_s

    async def take_finished(self, session_id: str) -> BackgroundCheck:
        try:
            reply = await self._stub.BackgroundResults(tools_pb2.BackgroundResultsRequest(session_id=session_id),
                                                       timeout=self._timeout_s, metadata=trace_metadata())
        except grpc.aio.AioRpcError as err:
            raise Unavailable(f"the tools service at {self._target} did not answer ({rpc_detail(err)})") from None
        return BackgroundCheck([BackgroundDone(id=c.id, command=c.command, status=c.status,
                                               result=tool_result_from_proto(c.result),
                                               seconds=max(c.finished_at - c.started_at, 0.0)) for c in reply.finished],
                               reply.running)

    async def stop(self, session_id: str) -> int:
        try:
            reply = await self._stub.StopBackground(tools_pb2.StopBackgroundRequest(session_id=session_id),
                                                    timeout=self._timeout_s, metadata=trace_metadata())
        except grpc.aio.AioRpcError as err:
            raise Unavailable(f"the tools service at {self._target} did not answer ({rpc_detail(err)})") from None
        return reply.stopped


# --- memory ---------------------------------------------------------------------------------


class GrpcTranscripts:
    """Transcripts on the memory service. An append that finds memory away (restarting, a
    replica gone) is retried until it is saved or `save_within_s` has passed: the loop shows a
    step to the client only once it is saved, so a short outage delays the turn instead of
    failing it, and a long one fails it before anything unsaved is shown."""

    RETRY_FIRST_S = 0.1
    RETRY_MAX_S = 1.0

    def __init__(self, client: MemoryClient, *, save_within_s: float = 30.0):
        self._client = client  # its errors already name the memory service and its address
        self._save_within_s = save_within_s

    async def load(self, session_id: str) -> list[ChatMessage]:
        try:
            messages = await self._client.transcript(session_id)
        except AgentmeshError as exc:
            raise type(exc)(f"could not read the session's transcript: {exc.message}") from None
        return [message_from_proto(m) for m in messages]

    async def append(self, session_id: str, messages: Sequence[ChatMessage]) -> None:
        batch = [message_to_proto(m) for m in messages]
        delay = self.RETRY_FIRST_S
        last: AgentmeshError | None = None
        try:
            async with asyncio.timeout(self._save_within_s):
                while True:
                    try:
                        await self._client.append_messages(session_id, batch)
                        return
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
    append (GrpcTranscripts); an older memory service without it raises NotSupported."""

    PAGE = 1000

    def __init__(self, client: MemoryClient, target: str, *, save_within_s: float = 30.0):
        self._client = client
        self._target = target
        self._save_within_s = save_within_s

    async def start(self, session_id: str, first: Sequence[ChatMessage], *, namespace: str, query: str,
                    k: int, recall_timeout_s: float) -> TurnBeginning:
        request = memory_pb2.StartTurnRequest(
            session_id=session_id, messages=[message_to_proto(m) for m in first], page_size=self.PAGE,
            namespace=namespace, recall_query=query, recall_k=k, recall_timeout_s=recall_timeout_s)
        try:
            reply = await self._call(request)
            stored = list(reply.messages)
            after = reply.next_after_seq
            while after:  # a long transcript: the rest of what preceded the appended messages
                page, after = await self._client.list_messages(session_id, after_seq=after, page_size=self.PAGE)
                stored += [m for m in page if m.seq < reply.first_seq]
                if page and page[-1].seq >= reply.first_seq - 1:
                    break
        except AgentmeshError as exc:
            if isinstance(exc, NotSupported):
                raise
            raise type(exc)(f"could not start the turn in the session's transcript: {exc.message}") from None
        hits = [MemoryHit(id=h.memory.id, text=h.memory.text, kind=h.memory.kind, score=h.score,
                          created_at=h.memory.created_at) for h in reply.recalled]
        return TurnBeginning([message_from_proto(m) for m in stored], hits, reply.recall_error)

    async def _call(self, request: memory_pb2.StartTurnRequest) -> memory_pb2.StartTurnResponse:
        delay = GrpcTranscripts.RETRY_FIRST_S
        last: AgentmeshError | None = None
        try:
            async with asyncio.timeout(self._save_within_s):
                while True:
                    try:
                        return await self._client.stub.StartTurn(request, timeout=self._save_within_s)
                    except grpc.aio.AioRpcError as err:
                        if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                            raise NotSupported(f"the memory service at {self._target} has no StartTurn") from None
                        error = peer_error(err, f"the memory service at {self._target}")
                        if not isinstance(error, Unavailable):
                            raise error from None
                        last = error
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, GrpcTranscripts.RETRY_MAX_S)
        except TimeoutError:
            reason = last.message if last else f"the memory service at {self._target} did not answer"
            raise Unavailable(f"not done within {self._save_within_s:g}s: {reason}") from None


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
    def _hit(record: memory_pb2.MemoryRecord, score: float = 0.0) -> MemoryHit:
        return MemoryHit(id=record.id, text=record.text, kind=record.kind, score=score, created_at=record.created_at)

    async def remember(self, namespace: str, text: str, kind: str, source_session_id: str) -> MemoryHit:
        request = memory_pb2.RememberRequest(namespace=namespace, text=text, kind=kind, source_session_id=source_session_id)
        try:
            record = await self._stub.Remember(request, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as err:
            raise self._error(err) from None
        return self._hit(record)

    async def search(self, namespace: str, query: str, k: int) -> list[MemoryHit]:
        try:
            reply = await self._stub.Search(memory_pb2.SearchRequest(namespace=namespace, query=query, k=k), timeout=self._timeout_s)
        except grpc.aio.AioRpcError as err:
            raise self._error(err) from None
        return [self._hit(h.memory, h.score) for h in reply.hits]


class GrpcUsageLog:
    """The usage ledger on the memory service (usage_log.py); one record per model call."""

    def __init__(self, client: MemoryClient):
        self._client = client

    async def record(self, entry: UsageEntry) -> None:
        u = entry.usage
        await self._client.record_usage([memory_pb2.UsageRecord(
            id=entry.id, at=entry.at, session_id=entry.session_id, run_id=entry.run_id, namespace=entry.namespace,
            model_name=entry.model_name, model=entry.model, provider=entry.provider, input_tokens=u.input_tokens,
            output_tokens=u.output_tokens, cached_input_tokens=u.cached_input_tokens, fallback=entry.fallback,
            purpose=entry.purpose, root_session_id=entry.root_session_id,
        )])
