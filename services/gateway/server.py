"""gRPC adapter of the gateway: the public API, authentication, and wiring to its peers."""

from __future__ import annotations

from agentmesh.config import Settings
from agentmesh.gateway.auth import BearerTokenInterceptor
from agentmesh.gateway.core import Gateway
from agentmesh.gateway.peers import AgentClient, MemorySessions, ToolsWorkspaces
from agentmesh.gateway.settings import GatewaySettings
from agentmesh.rpc.client import open_channel
from agentmesh.rpc.errors import translate_errors
from agentmesh.rpc.server import ServiceHost
from agentmesh.telemetry import Telemetry
from agentmesh.v1 import gateway_pb2, gateway_pb2_grpc


class GatewayServicer(gateway_pb2_grpc.GatewayServicer):
    def __init__(self, core: Gateway):
        self._core = core

    @translate_errors
    async def CreateSession(self, request, context):
        return await self._core.create_session(request)

    @translate_errors
    async def GetSession(self, request, context):
        return await self._core.get_session(request.session_id)

    @translate_errors
    async def ListSessions(self, request, context):
        return await self._core.list_sessions(request.page_size, request.page_token)

    @translate_errors
    async def DeleteSession(self, request, context):
        return gateway_pb2.DeleteSessionResponse(deleted=await self._core.delete_session(request.session_id))

    @translate_errors
    async def Chat(self, request, context):
        async for event in self._core.chat(request):
            yield event

    @translate_errors
    async def Cancel(self, request, context):
        cancelled, run_id = await self._core.cancel(request.session_id)
        return gateway_pb2.CancelResponse(cancelled=cancelled, run_id=run_id)

    @translate_errors
    async def Approve(self, request, context):
        run_id = await self._core.approve(request)
        return gateway_pb2.ApproveResponse(accepted=True, run_id=run_id)

    @translate_errors
    async def ListApprovals(self, request, context):
        return await self._core.pending_approvals(request.session_id)

    @translate_errors
    async def GetTranscript(self, request, context):
        return await self._core.transcript(request.session_id, request.page_size, request.after_seq)


async def build(settings: Settings, telemetry: Telemetry, address: str | None = None) -> ServiceHost:
    gateway_settings = GatewaySettings.from_env(settings.environ)
    channels = {name: open_channel(settings.address_of(name), telemetry) for name in ("memory", "agent", "tools")}
    core = Gateway(
        sessions=MemorySessions(channels["memory"], settings.address_of("memory")),
        agent=AgentClient(channels["agent"], settings.address_of("agent")),
        workspaces=ToolsWorkspaces(channels["tools"], settings.address_of("tools")),
        settings=gateway_settings,
    )
    host = ServiceHost(
        "gateway", settings, telemetry, address=address, interceptors=[BearerTokenInterceptor(settings.auth_tokens)]
    )
    host.add(gateway_pb2_grpc.add_GatewayServicer_to_server, GatewayServicer(core), "agentmesh.v1.Gateway")

    async def close_channels() -> None:
        for channel in channels.values():
            await channel.close()

    host.on_drain(core.drain)
    host.on_stop(close_channels)
    return host
