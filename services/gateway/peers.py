"""Adapters from the gateway core's ports to its peers over gRPC (memory, agent, tools)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import AsyncIterator, Hashable

import grpc

from agentmesh.clients.agent import AgentClient
from agentmesh.clients.memory import MemoryClient
from agentmesh.clients.tools import ToolsClient
from agentmesh.errors import Unavailable
from agentmesh.internal.v1 import agent_service_pb2, memory_service_pb2, tools_service_pb2
from agentmesh.rpc.auth import current_principal
from agentmesh.rpc.errors import core_error_from_rpc
from agentmesh.rpc.identity import Principal
from agentmesh.rpc.peers import peer_call
from agentmesh.telemetry.traceview import TraceView, load_trace
from agentmesh.tenancy import encode_memberships
from agentmesh.v1 import common_pb2, gateway_pb2, sessions_pb2, tools_pb2

RPC_TIMEOUT_S = 30.0
MCP_ADD_TIMEOUT_S = 60.0
COPY_TIMEOUT_S = 300.0  # a workspace up to its quota (1 GiB by default) copied on the tools service's disk


class MemorySessions:
    def __init__(self, client: MemoryClient):
        self._stub = client.stub
        self._target = client.target

    async def _call(self, method, request):
        return await peer_call(f"the memory service at {self._target}", method(request, timeout=RPC_TIMEOUT_S))

    async def put_session(self, session: sessions_pb2.Session) -> tuple[sessions_pb2.Session, bool]:
        reply = await self._call(self._stub.PutSession, memory_service_pb2.PutSessionRequest(session=session))
        return reply.session, reply.created

    async def get_session(self, session_id: str) -> sessions_pb2.Session:
        return await self._call(self._stub.GetSession, sessions_pb2.GetSessionRequest(session_id=session_id))

    async def list_sessions(self, page_size: int, page_token: str) -> sessions_pb2.ListSessionsResponse:
        request = sessions_pb2.ListSessionsRequest(page_size=page_size, page_token=page_token)
        return await self._call(self._stub.ListSessions, request)

    async def delete_session(self, session_id: str) -> bool:
        reply = await self._call(self._stub.DeleteSession, sessions_pb2.DeleteSessionRequest(session_id=session_id))
        return reply.deleted

    async def list_messages(self, session_id: str, page_size: int, after_seq: int) -> sessions_pb2.GetTranscriptResponse:
        request = sessions_pb2.GetTranscriptRequest(session_id=session_id, page_size=page_size, after_seq=after_seq)
        return await self._call(self._stub.ListMessages, request)

    async def list_model_calls(self, session_id: str, run_id: str) -> sessions_pb2.ListModelCallsResponse:
        request = sessions_pb2.ListModelCallsRequest(session_id=session_id, run_id=run_id)
        return await self._call(self._stub.ListModelCalls, request)

    async def update_session(self, request: sessions_pb2.UpdateSessionRequest) -> sessions_pb2.Session:
        return await self._call(self._stub.UpdateSession, request)

    async def clear_transcript(self, session_id: str) -> int:
        reply = await self._call(self._stub.ClearTranscript, sessions_pb2.ClearTranscriptRequest(session_id=session_id))
        return reply.cleared

    async def fork_session(self, request: sessions_pb2.ForkSessionRequest) -> sessions_pb2.ForkSessionResponse:
        return await self._call(self._stub.ForkSession, request)

    async def undo_fork(self, session_id: str, tenant: str) -> None:
        """Remove a fork the gateway has just written, whose workspace could not be copied. A
        member may fork but not delete: the removal is signed as the fork's tenant's admin —
        for this one session, which nobody else has seen yet."""
        principal = current_principal.get()
        elevated = Principal(subject=principal.subject if principal else "service:gateway",
                             tenant=encode_memberships({tenant: "admin"})) if tenant else principal
        token = current_principal.set(elevated)
        try:
            await self.delete_session(session_id)
        finally:
            current_principal.reset(token)

    async def put_a2a_task(self, namespace: str, task_id: str, task_json: str) -> None:
        await self._call(self._stub.PutA2aTask, memory_service_pb2.A2aTaskRecord(namespace=namespace, task_id=task_id,
                                                                       task_json=task_json))

    async def get_a2a_task(self, namespace: str, task_id: str) -> str:
        """The task's JSON; NotFound when the memory service has none."""
        reply = await self._call(self._stub.GetA2aTask, memory_service_pb2.GetA2aTaskRequest(namespace=namespace, task_id=task_id))
        return str(reply.task_json)

    def signer(self) -> Principal | None:
        return current_principal.get()

    async def put_runs(self, runs: list[sessions_pb2.Run], signer: Hashable = None) -> list[str]:
        """The runs' records in one call signed for `signer` (a Principal from `signer()`; None:
        the caller's own); per run, "" or why memory did not store it."""
        token = current_principal.set(signer) if isinstance(signer, Principal) else None
        try:
            reply = await self._call(self._stub.PutRunRecords, memory_service_pb2.PutRunRecordsRequest(runs=runs))
        finally:
            if token is not None:
                current_principal.reset(token)
        return list(reply.errors)

    async def get_run(self, run_id: str) -> sessions_pb2.Run:
        return await self._call(self._stub.GetRunRecord, sessions_pb2.GetRunRecordRequest(run_id=run_id))

    async def list_runs(self, request: sessions_pb2.ListRunRecordsRequest) -> sessions_pb2.ListRunRecordsResponse:
        return await self._call(self._stub.ListRunRecords, request)

    async def default_webhook(self, namespace: str) -> str:
        reply = await self._call(self._stub.GetNamespaceWebhook,
                                 sessions_pb2.GetNamespaceWebhookRequest(namespace=namespace))
        return str(reply.default_url)

    async def set_default_webhook(self, namespace: str, url: str) -> str:
        reply = await self._call(self._stub.SetNamespaceWebhook,
                                 sessions_pb2.NamespaceWebhook(namespace=namespace, default_url=url))
        return str(reply.default_url)

    async def webhook_secret(self, namespace: str) -> str:
        reply = await self._call(self._stub.GetWebhookSecret, sessions_pb2.GetWebhookSecretRequest(namespace=namespace))
        return str(reply.secret)

    async def get_namespace_settings(self, namespace: str) -> sessions_pb2.NamespaceSettings:
        return await self._call(self._stub.GetNamespaceSettings, sessions_pb2.GetNamespaceSettingsRequest(namespace=namespace))

    async def update_namespace_settings(
            self, request: sessions_pb2.UpdateNamespaceSettingsRequest) -> sessions_pb2.NamespaceSettings:
        return await self._call(self._stub.UpdateNamespaceSettings, request)

    async def sweep(self, request: memory_service_pb2.SweepRequest) -> memory_service_pb2.SweepResponse:
        return await self._call(self._stub.Sweep, request)

    async def erase_user(self, request: sessions_pb2.EraseUserRequest) -> sessions_pb2.EraseUserResponse:
        return await self._call(self._stub.EraseUser, request)

    async def drop_run(self, session_id: str, run_id: str) -> int:
        reply = await self._call(self._stub.DropRun, memory_service_pb2.DropRunRequest(session_id=session_id, run_id=run_id))
        return reply.dropped

    async def sum_usage(self, start: float, end: float, group_by: str) -> list[memory_service_pb2.UsageSum]:
        reply = await self._call(self._stub.SumUsage, memory_service_pb2.SumUsageRequest(start=start, end=end, group_by=group_by))
        return list(reply.sums)

    async def search(self, namespace: str, query: str, k: int, kinds: list[str]) -> gateway_pb2.SearchMemoryResponse:
        request = memory_service_pb2.SearchRequest(namespace=namespace, query=query, k=k, filter=memory_service_pb2.MemoryFilter(kinds=kinds))
        reply = await self._call(self._stub.Search, request)
        return gateway_pb2.SearchMemoryResponse(
            hits=[
                gateway_pb2.MemoryHit(
                    id=hit.memory.id,
                    text=hit.memory.text,
                    kind=hit.memory.kind,
                    score=hit.score,
                    created_at=hit.memory.created_at,
                    source_session_id=hit.memory.source_session_id,
                )
                for hit in reply.hits
            ]
        )


class AgentTurns:
    # A turn waits this long for an agent that is (re)starting before it is refused: a rolling
    # restart should not fail the turns that arrive during it.
    CONNECT_WAIT_S = 10.0

    def __init__(self, client: AgentClient):
        self._channel = client.channel
        self._stub = client.stub
        self._target = client.target

    async def _connected(self) -> None:
        if self._channel.get_state() == grpc.ChannelConnectivity.READY:
            return  # the usual case: no waiter task and timer for every turn
        try:
            await asyncio.wait_for(self._channel.channel_ready(), self.CONNECT_WAIT_S)
        except TimeoutError:
            raise Unavailable(
                f"the agent service at {self._target} is not reachable (waited {self.CONNECT_WAIT_S:.0f}s)"
            ) from None

    async def run_turn(
        self, request: agent_service_pb2.RunTurnRequest, controls: "asyncio.Queue[agent_service_pb2.RunTurnRequest | None]"
    ) -> AsyncIterator[common_pb2.Event]:
        async def requests() -> AsyncIterator[agent_service_pb2.RunTurnRequest]:
            # The turn first, then each approval decision (or an interrupt) on the same stream: it
            # reaches the very agent replica running the turn, with no lookup and no affinity to
            # configure. gRPC reads this in a task of its own until it ends: the None put on the
            # queue when the call is over ends it (left waiting, the task would stay pending until
            # the call is garbage-collected: "Task was destroyed but it is pending").
            yield request
            while (control := await controls.get()) is not None:
                yield control

        await self._connected()
        call = self._stub.RunTurn(requests())
        try:
            async for event in call:
                yield event
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.UNAVAILABLE:
                raise Unavailable(
                    f"the agent service at {self._target} stopped answering; steps completed so far are saved"
                ) from None
            raise core_error_from_rpc(err) from None
        finally:
            controls.put_nowait(None)
            # Leaving early (cancel, client gone) must stop the run on the agent too.
            call.cancel()


class ToolsWorkspaces:
    """The tools service: workspaces (deleted with their session, browsed from the console) and the catalog."""

    def __init__(self, client: ToolsClient):
        self._stub = client.stub
        self._target = client.target

    async def delete_workspace(self, session_id: str) -> None:
        request = tools_service_pb2.DeleteWorkspaceRequest(session_id=session_id)
        await peer_call(f"the tools service at {self._target}", self._stub.DeleteWorkspace(request, timeout=RPC_TIMEOUT_S))

    async def copy_workspace(self, from_session_id: str, to_session_id: str) -> tuple[int, int]:
        """A fork's workspace copied from its source's: (files, bytes)."""
        request = tools_service_pb2.CopyWorkspaceRequest(from_session_id=from_session_id, to_session_id=to_session_id)
        reply = await self._call(self._stub.CopyWorkspace(request, timeout=COPY_TIMEOUT_S))
        return reply.files, reply.bytes

    async def list_tools(self, namespace: str = "") -> tools_pb2.ListToolsResponse:
        return await self._call(self._stub.ListTools(tools_pb2.ListToolsRequest(namespace=namespace), timeout=RPC_TIMEOUT_S))

    async def sandbox_templates(self) -> list[str]:
        """The names of the deployment's sandbox templates."""
        reply = await self._call(self._stub.ListSandboxTemplates(tools_pb2.ListSandboxTemplatesRequest(),
                                                                 timeout=RPC_TIMEOUT_S))
        return [t.name for t in reply.templates]

    # A namespace's own MCP servers. Adding one starts it and lists its tools: give it time.
    async def add_mcp_server(self, request: tools_pb2.AddMcpServerRequest) -> tools_pb2.McpServerStatus:
        return await self._call(self._stub.AddMcpServer(request, timeout=MCP_ADD_TIMEOUT_S))

    async def list_mcp_servers(self, request: tools_pb2.ListMcpServersRequest) -> tools_pb2.ListMcpServersResponse:
        return await self._call(self._stub.ListMcpServers(request, timeout=MCP_ADD_TIMEOUT_S))

    async def remove_mcp_server(self, request: tools_pb2.RemoveMcpServerRequest) -> tools_pb2.RemoveMcpServerResponse:
        return await self._call(self._stub.RemoveMcpServer(request, timeout=MCP_ADD_TIMEOUT_S))

    async def list_workspace(self, request: tools_pb2.ListWorkspaceRequest) -> tools_pb2.ListWorkspaceResponse:
        return await self._call(self._stub.ListWorkspace(request, timeout=RPC_TIMEOUT_S))

    async def read_workspace_file(self, request: tools_pb2.ReadWorkspaceFileRequest) -> tools_pb2.ReadWorkspaceFileResponse:
        return await self._call(self._stub.ReadWorkspaceFile(request, timeout=RPC_TIMEOUT_S))

    async def write_workspace_file(self, request: tools_pb2.WriteWorkspaceFileRequest) -> tools_pb2.WriteWorkspaceFileResponse:
        return await self._call(self._stub.WriteWorkspaceFile(request, timeout=RPC_TIMEOUT_S))

    async def _call(self, call):
        return await peer_call(f"the tools service at {self._target}", call)


class LocalTraces:
    """The local span store under AGENTMESH_HOME; `directory` None when traces are kept elsewhere."""

    def __init__(self, directory: Path | None):
        self._directory = directory

    @property
    def where(self) -> Path | None:
        return self._directory

    def load(self, trace_id: str) -> TraceView:
        assert self._directory is not None
        return load_trace(self._directory, trace_id)
