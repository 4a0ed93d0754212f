"""The gateway's composition root: `build()` wires its cores, its clients to the other services,
its peers, its HTTP/A2A/MCP doors and the servicer onto a host without starting it
(agentmesh.rpc.launch starts it from here)."""

from __future__ import annotations

from agentmesh.clients.agent import AgentClient
from agentmesh.clients.memory import MemoryClient
from agentmesh.clients.tools import ToolsClient
from agentmesh.config import Settings
from agentmesh.gateway.a2a.endpoint import A2aEndpoints
from agentmesh.gateway.authz import Authorizer
from agentmesh.gateway.core import Gateway
from agentmesh.gateway.forwarding import Forwarder, SessionRouter
from agentmesh.gateway.http.guard import HttpLimits
from agentmesh.gateway.http.server import HttpApi, package_version
from agentmesh.gateway.learning import MemoryLearning
from agentmesh.gateway.limits import TenantLimiter
from agentmesh.gateway.live import LiveTurns
from agentmesh.gateway.mcp_endpoint import McpEndpoint
from agentmesh.gateway.membership import Membership, Resolver, resolve_addresses
from agentmesh.gateway.openai_endpoint import OpenAiEndpoint
from agentmesh.gateway.peers import AgentTurns, LocalTraces, MemorySessions, ToolsWorkspaces
from agentmesh.gateway.policy import Policies
from agentmesh.gateway.reflect import AgentReflect
from agentmesh.gateway.resources import Resources
from agentmesh.gateway.retention import RetentionDriver
from agentmesh.gateway.run_rpcs import RunRpcs
from agentmesh.gateway.runs import RunLedger
from agentmesh.gateway.server import GatewayServicer
from agentmesh.gateway.settings import GatewaySettings
from agentmesh.gateway.team_rpcs import TeammateRecovery
from agentmesh.gateway.usage import UsageReports
from agentmesh.gateway.webhooks import Webhooks
from agentmesh.models import catalog_of
from agentmesh.rpc.auth import CallerCheck
from agentmesh.rpc.client import open_channel
from agentmesh.rpc.identity import ServiceIdentity
from agentmesh.rpc.server import ServiceHost
from agentmesh.telemetry import Telemetry
from agentmesh.telemetry.spanstore import span_store_dir
from agentmesh.toolpolicy import ToolPolicy
from agentmesh.v1 import agents_pb2, gateway_pb2_grpc, sessions_pb2, tools_pb2


def _protocol_endpoints(settings: Settings, resources: Resources, sessions: MemorySessions | None = None,
                        callers: CallerCheck | None = None, learning: MemoryLearning | None = None) -> list:
    """The A2A agents and the MCP server, on the HTTP address (docs/api.md, "Open protocols")."""
    gateway_settings = settings.section(GatewaySettings)
    endpoints: list = []
    if gateway_settings.a2a:
        endpoints.append(A2aEndpoints(
            lambda namespace: resources.list_tools(tools_pb2.ListToolsRequest(namespace=namespace)),
            description=gateway_settings.agent_description,
            version=package_version(), public_url=gateway_settings.public_url,
            bearer_required=settings.auth_policy.checks_users, max_depth=gateway_settings.a2a_max_depth,
            tasks=sessions, callers=callers,
            agents=(lambda namespace, name: learning.forward(
                "GetAgent", agents_pb2.GetAgentRequest(namespace=namespace, name=name))) if learning else None))
    if gateway_settings.mcp:
        endpoints.append(McpEndpoint(description=gateway_settings.agent_description, version=package_version()))
    # The namespace's named agents as OpenAI "models" (docs/agents.md); under the caller's own token.
    endpoints.append(OpenAiEndpoint())
    return endpoints


async def build(settings: Settings, telemetry: Telemetry, address: str | None = None, *,
                peer_resolver: Resolver = resolve_addresses) -> ServiceHost:
    """The gateway, unstarted. `peer_resolver` answers the DNS lookups of
    AGENTMESH_GATEWAY_PEERS=dns:///...; tests give one that answers what they choose."""
    gateway_settings = settings.section(GatewaySettings)
    identity = ServiceIdentity.open("gateway", settings.keys_dir)
    channels = {
        name: open_channel(settings.address_of(name), telemetry, identity=identity, audience=name)
        for name in ("memory", "agent", "tools")
    }
    # One client per peer service, built here once and handed to every adapter that calls it.
    memory_client = MemoryClient(channels["memory"], settings.address_of("memory"))
    agent_client = AgentClient(channels["agent"], settings.address_of("agent"))
    sessions = MemorySessions(memory_client)
    tools = ToolsWorkspaces(ToolsClient(channels["tools"], settings.address_of("tools")))
    catalog = catalog_of(settings.llm)
    host = ServiceHost("gateway", settings, telemetry, address=address, identity=identity,
                       max_receive_bytes=gateway_settings.max_request_bytes)
    authz = Authorizer(sessions, host.audit)
    policies = Policies(sessions, tools, deployment=ToolPolicy(gateway_settings.tools_allow, gateway_settings.tools_deny),
                        permission_mode=gateway_settings.permission_mode)
    core = Gateway(
        policies=policies,
        sessions=sessions,
        agent=AgentTurns(agent_client),
        workspaces=tools,
        settings=gateway_settings,
        models=catalog,
        authz=authz,
        limits=TenantLimiter(settings.auth_policy),
        live=LiveTurns(gateway_settings.advertise_address if gateway_settings.peers.enabled else ""),
        runs=RunLedger(sessions, gateway_settings.run_lease_s),
    )
    # Run webhooks: delivered from here, written back through the run ledger (webhooks.py says why).
    webhooks = Webhooks(sessions, gateway_settings.webhook_allow_private, gateway_settings.webhook_retry_base_s,
                        gateway_settings.webhook_max_attempts, core.runs.update_webhook)
    learning = MemoryLearning(memory_client)
    run_rpcs = RunRpcs(core, authz, webhooks.check)
    # A teammate's run that ends without it finishing is started again from here (team_rpcs.py).
    teammates = TeammateRecovery(learning, run_rpcs.create)

    def run_ended(run: sessions_pb2.Run) -> None:
        webhooks.ended(run)
        teammates.ended(run)

    core.runs.on_end = run_ended
    traces = LocalTraces(span_store_dir(settings.home) if settings.traces == "local" else None)
    resources = Resources(sessions=sessions, tools=tools, files=tools, memory=sessions, traces=traces,
                          max_upload_bytes=gateway_settings.max_upload_bytes, policies=policies, authz=authz)
    router = None
    if gateway_settings.peers.enabled:
        membership = Membership(
            gateway_settings.peers, gateway_settings.advertise_address, gateway_settings.peer_refresh_s,
            resolver=peer_resolver, handoff_window_s=gateway_settings.turn_timeout_s,
        )
        forwarder = Forwarder(telemetry, gateway_settings.peer_connect_timeout_s, identity)
        membership.on_change(forwarder.retain)
        await membership.start()
        router = SessionRouter(membership, forwarder, core.has_active_turn)
        host.on_drain(forwarder.drain)
        host.on_stop(forwarder.close)
        host.on_stop(membership.stop)  # on_stop runs in reverse: the lookups stop first
    reflect = AgentReflect(agent_client)
    servicer = GatewayServicer(
        core, resources, UsageReports(sessions, catalog), router, reflect, learning, authz,
        run_rpcs, sessions.webhook_secret, webhooks,
        RetentionDriver(sessions, tools, core.has_active_turn, host.audit, telemetry.metrics,
                        settings.auth_policy.owner_of if settings.auth_policy.enforced else None))
    servicer.managed_agent_namespaces = frozenset(settings.managed_agent_namespaces)
    host.add(gateway_pb2_grpc.add_GatewayServicer_to_server,
             servicer,
             "agentmesh.v1.Gateway")

    async def close_channels() -> None:
        for channel in channels.values():
            await channel.close()

    host.on_drain(teammates.close)
    host.on_drain(core.drain)
    host.on_drain(core.live.drain)
    host.on_stop(close_channels)
    # Registered after close_channels, so it runs before it: the runs' last records reach memory.
    host.on_stop(core.runs.drain)
    host.on_stop(webhooks.close)  # before the ledger's last writes (on_stop runs in reverse)
    host.on_start(webhooks.resume)
    if gateway_settings.http_address:
        limits = HttpLimits(gateway_settings.http_header_timeout_s, gateway_settings.http_body_timeout_s,
                            gateway_settings.http_idle_timeout_s, gateway_settings.http_max_connections_per_ip)
        # Who an HTTP request is from, when it is refused before its RPC (the scheduler's routes
        # are checked as the scheduler checks them).
        callers = {"Gateway": host.calls.callers,
                   "Scheduler": CallerCheck("scheduler", identity, host.users)} if host.calls.callers else None
        http = HttpApi(gateway_settings.http_address, telemetry, gateway_settings.http_max_body_bytes,
                       settings.address_of("scheduler"), endpoints=_protocol_endpoints(settings, resources, sessions, host.calls.callers,
                                                                 learning),
                       limits=limits, callers=callers)

        async def start_http() -> None:
            await http.start(host.target)
            host.endpoints["http"] = http.target

        host.on_start(start_http)
        host.on_stop(http.stop)
    return host
