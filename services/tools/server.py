"""gRPC adapter of the tools service: ToolsServicer <-> ToolService, and the wiring in `build()`."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import grpc
from opentelemetry import trace

from agentmesh.clients.memory import MemoryClient
from agentmesh.config import Settings
from agentmesh.errors import FailedPrecondition, PermissionDenied
from agentmesh.ids import validate_namespace
from agentmesh.images import ATTACHMENTS_DIR
from agentmesh.internal.v1 import tools_service_pb2, tools_service_pb2_grpc
from agentmesh.logs import get_logger
from agentmesh.rpc.auth import current_principal
from agentmesh.rpc.calls import ServerCalls
from agentmesh.rpc.carried import CarriedCalls, ServedMethod, oneof_answers
from agentmesh.rpc.client import open_channel
from agentmesh.rpc.convert import tool_result_to_proto, tool_spec_to_proto
from agentmesh.rpc.errors import translate_errors
from agentmesh.rpc.identity import ServiceIdentity
from agentmesh.rpc.server import MAX_MESSAGE_BYTES, MIB, ServiceHost
from agentmesh.telemetry import Telemetry
from agentmesh.tools.background import BackgroundCommands
from agentmesh.tools.catalog import ToolProvider
from agentmesh.tools.command_tools import CommandTools
from agentmesh.tools.core import ToolService
from agentmesh.tools.file_tools import FileTools
from agentmesh.tools.mcp.a2a_agents import DEPTH_KEY
from agentmesh.tools.mcp.memory_registrations import MemoryRegistrations
from agentmesh.tools.mcp.namespaces import NamespaceServers
from agentmesh.tools.mcp.wiring import (
    ConnectionFactory,
    build_a2a_tools,
    build_mcp_tools,
    secret_source,
    start_mcp_tools,
)
from agentmesh.tools.sandbox.base import Executor
from agentmesh.tools.sandbox.per_template import TemplateSandboxes
from agentmesh.tools.sandbox.templates import SandboxTemplate
from agentmesh.tools.search_tools import SearchTools
from agentmesh.tools.settings import ToolsSettings
from agentmesh.tools.tenancy import SessionTenants
from agentmesh.tools.web_tools import AddressPolicy, WebTools
from agentmesh.tools.workspace import Workspaces
from agentmesh.tools.workspace_files import WorkspaceFiles, is_stored_image
from agentmesh.v1 import sessions_pb2, tools_pb2

log = get_logger("agentmesh.tools")

EXECUTE_METHOD = "/agentmesh.internal.v1.Tools/Execute"


class ToolsServicer(tools_service_pb2_grpc.ToolsServicer):
    def __init__(self, calls: ServerCalls, core: ToolService, files: WorkspaceFiles,
                 tenants: SessionTenants | None = None):
        self._core = core
        self._files = files
        # Where tenants are configured: the session's tenant, asked of memory (tenancy.py).
        self._tenants = tenants
        # The agent's Execute calls, carried on one stream per agent process; served through
        # the host's interceptor (`calls`) as unary calls are.
        self.carried_calls = CarriedCalls(calls, {"execute": ServedMethod(EXECUTE_METHOD, self.execute)},
                                          wrap=oneof_answers(tools_service_pb2.CarriedToolsAnswer))

    async def _session(self, session_id: str, method: str, *, grows: bool = False) -> str:
        """The session's tenant ("" without tenancy), once the caller may use the session."""
        tenant = ""
        if self._tenants is not None and session_id:
            tenant = await self._tenants.require(session_id, method)
            if grows and tenant:
                await self._tenants.check_disk(session_id, tenant)
        return tenant

    @translate_errors
    async def ListTools(self, request, context):
        specs, version = await self._core.versioned_catalog(request.namespace, _version(request))
        down = await self._core.unavailable_servers(request.namespace, _version(request))
        return tools_pb2.ListToolsResponse(
            tools=[tool_spec_to_proto(spec) for spec in specs], catalog_version=version,
            unavailable_mcp_servers=[tools_pb2.McpServerStatus(server=tools_pb2.McpServerSpec(name=name), error=error)
                                     for name, error in sorted(down.items())])

    @translate_errors
    async def ListSandboxTemplates(self, request, context):
        templates = self._core.templates.all() if self._core.templates is not None else []
        return tools_pb2.ListSandboxTemplatesResponse(templates=[tools_pb2.SandboxTemplate(**t.as_dict()) for t in templates])

    @translate_errors
    async def WatchCatalog(self, request, context):
        async for version in self._core.versions.watch():
            yield tools_service_pb2.CatalogVersion(version=version)

    @translate_errors
    async def Execute(self, request, context):
        return await self.execute(request)

    def CarriedCalls(self, request_iterator, context):
        """Execute calls carried on one stream (agentmesh.rpc.carried), each served as the unary
        call is — checked, traced and measured as one, stopped at its deadline, cancelled (its
        sandboxed process killed) when its caller cancels it or the stream ends."""
        return self.carried_calls.serve(request_iterator)

    async def execute(self, request: tools_service_pb2.ExecuteRequest) -> tools_service_pb2.ExecuteResponse:
        """Execute's work, for the unary call and for each call carried on CarriedCalls."""
        tenant = await self._session(request.session_id, "Execute", grows=True)
        outcome = await self._core.execute(
            request.session_id, request.call_id, request.name, request.arguments_json, request.timeout_s,
            namespace=request.namespace, mcp_version=_version(request), sandbox_template=request.sandbox_template,
            isolation=request.isolation, tenant=tenant,
        )
        return tools_service_pb2.ExecuteResponse(result=tool_result_to_proto(replace(outcome, call_id=request.call_id, name=request.name)))

    # --- a namespace's own MCP servers ---

    def _namespaces(self) -> NamespaceServers:
        if not isinstance(self._core.namespaces, NamespaceServers):
            raise FailedPrecondition("this tools service keeps no per-namespace MCP servers")
        return self._core.namespaces

    @translate_errors
    async def AddMcpServer(self, request, context):
        namespace = validate_namespace(request.namespace)
        spec = request.server
        raw = {"name": spec.name, "command": spec.command, "args": list(spec.args), "url": spec.url,
               "headers": dict(spec.headers), "env_secrets": dict(spec.env_secrets),
               "header_secrets": dict(spec.header_secrets)}
        status = await self._namespaces().add(namespace, raw)
        await self._core.versions.settled()  # every agent told before the next turn can start
        return _server_status(status)

    @translate_errors
    async def ListMcpServers(self, request, context):
        namespace = validate_namespace(request.namespace)
        return tools_pb2.ListMcpServersResponse(servers=[_server_status(s) for s in await self._namespaces().list(namespace)])

    @translate_errors
    async def RemoveMcpServer(self, request, context):
        await self._namespaces().remove(validate_namespace(request.namespace), request.name)
        await self._core.versions.settled()
        return tools_pb2.RemoveMcpServerResponse(removed=True)

    @translate_errors
    async def BackgroundResults(self, request, context):
        await self._session(request.session_id, "BackgroundResults")
        finished, running = self._core.background_results(request.session_id)
        return tools_service_pb2.BackgroundResultsResponse(running=running, finished=[
            tools_service_pb2.BackgroundCommand(id=c.id, command=c.command, status=c.status, started_at=c.started_at,
                                        finished_at=c.finished_at, result=tool_result_to_proto(replace(c.outcome, call_id=c.id, name="background_run")))
            for c in finished if c.outcome is not None
        ])

    @translate_errors
    async def WatchBackground(self, request, context):
        async for change in self._core.background_sessions.watch():
            yield tools_service_pb2.BackgroundSessions(complete=change.complete, pending=change.pending, cleared=change.cleared)

    @translate_errors
    async def StopBackground(self, request, context):
        await self._session(request.session_id, "StopBackground")
        return tools_service_pb2.StopBackgroundResponse(stopped=await self._core.stop_background(request.session_id))

    @translate_errors
    async def DeleteWorkspace(self, request, context):
        await self._session(request.session_id, "DeleteWorkspace")
        return tools_service_pb2.DeleteWorkspaceResponse(deleted=await self._core.delete_workspace(request.session_id))

    @translate_errors
    async def CopyWorkspace(self, request, context):
        # The target is a fork the gateway is making: its session is written after the copy.
        await self._session(request.from_session_id, "CopyWorkspace", grows=True)
        copied = await self._files.copy(request.from_session_id, request.to_session_id)
        return tools_service_pb2.CopyWorkspaceResponse(files=copied.files, bytes=copied.bytes)

    @translate_errors
    async def ListWorkspace(self, request, context):
        await self._session(request.session_id, "ListWorkspace")
        listing = await self._files.list(request.session_id, request.path)
        return tools_pb2.ListWorkspaceResponse(
            path=listing.path,
            entries=[tools_pb2.WorkspaceEntry(**vars(entry)) for entry in listing.entries],
            truncated=listing.truncated,
        )

    @staticmethod
    def _by_agent() -> bool:
        principal = current_principal.get()
        return principal is not None and principal.via == "agent"

    @translate_errors
    async def ReadWorkspaceFile(self, request, context):
        await self._session(request.session_id, "ReadWorkspaceFile")
        # The agent reads images: a user's attached by path, and the stored ones, whole.
        view = await self._files.read(request.session_id, request.path, request.max_bytes, images=self._by_agent())
        return tools_pb2.ReadWorkspaceFileResponse(
            path=view.path, content=view.content, size=view.size, truncated=view.truncated
        )

    @translate_errors
    async def WriteWorkspaceFile(self, request, context):
        # The agent writes only a session's stored images (docs/agent.md "Images"); any other
        # file it writes through the tools the model calls, checked and recorded as such.
        if self._by_agent() and not is_stored_image(request.path):
            raise PermissionDenied(f"tools.WriteWorkspaceFile refused: the agent service may write only the workspace's "
                                   f"{ATTACHMENTS_DIR}/ (its stored images); other files go through its tools")
        await self._session(request.session_id, "WriteWorkspaceFile", grows=True)
        written = await self._files.write(request.session_id, request.path, request.content, request.overwrite)
        return tools_pb2.WriteWorkspaceFileResponse(path=written.path, size=written.size, created=written.created)


def _version(request) -> float | None:
    """The namespace's mcp_servers_version the caller passed, if it did."""
    return request.mcp_servers_version if request.HasField("mcp_servers_version") else None


def _server_status(status: dict) -> tools_pb2.McpServerStatus:
    return tools_pb2.McpServerStatus(
        server=tools_pb2.McpServerSpec(name=status["name"], command=status.get("command", ""), args=status.get("args", []),
                                       url=status.get("url", ""), headers=status.get("headers", {}),
                                       env_secrets=status.get("env_secrets", {}),
                                       header_secrets=status.get("header_secrets", {})),
        available=status["available"], error=status["error"], tools=status["tools"])


def make_executor(settings: ToolsSettings, workspaces: Workspaces, telemetry: Telemetry) -> Executor:
    if settings.mode == "kubernetes":
        if settings.isolation == "session":
            from agentmesh.tools.sandbox.k8s_build import session_pods

            return session_pods(settings, workspaces, telemetry.tracer, telemetry.metrics)
        from agentmesh.tools.sandbox.kubernetes import KubernetesExecutor

        return KubernetesExecutor.from_settings(settings, workspaces, telemetry.tracer, telemetry.metrics)
    if settings.unsafe_no_isolation:
        from agentmesh.tools.sandbox.unsafe import UnsafeHostExecutor

        return UnsafeHostExecutor(settings, workspaces, telemetry.tracer)
    from agentmesh.tools.sandbox.local import LocalJail

    jail = LocalJail(settings, workspaces, telemetry.tracer, telemetry.metrics)
    if not jail.available:
        log.warning("bubblewrap not found: command tools will refuse to run", bwrap=settings.bwrap_path)
    if settings.isolation == "session":
        from agentmesh.tools.sandbox.session import SessionSandboxes

        return SessionSandboxes(jail, settings.session_idle_s, network=settings.command_network, egress=settings.egress)
    return jail


def build_core(settings: ToolsSettings, executor: Executor, workspaces: Workspaces, tracer: trace.Tracer | None = None,
               extra_providers: tuple = (), build_executor: Callable[[SandboxTemplate], Executor] | None = None,
               ) -> ToolService:
    """`build_executor`: how an executor for another sandbox template is made (None: calls naming
    one run in `executor` alike, after the name is checked)."""
    from agentmesh.tools.cell_images import CellImages
    from agentmesh.tools.sandbox.base import SessionKernel

    # A session sandbox per session, locally or in a cluster: `python` runs in its interpreter.
    sessions = executor if isinstance(executor, SessionKernel) else None
    sandboxes = TemplateSandboxes(settings.templates, executor, build_executor or (lambda template: executor))
    # In a session sandbox a background command runs in the session's jail (a server it starts is
    # on the loopback of later calls), and its output can be read while it runs.
    background = BackgroundCommands(executor, max_per_session=settings.background_per_session,
                                    max_lifetime_s=settings.background_max_s, network=settings.command_network,
                                    peek=sessions.peek if sessions is not None else None)
    providers: list[ToolProvider] = [
        CommandTools(executor, settings.limits, network=settings.command_network,
                     max_concurrent=settings.max_concurrent_sandboxes, kernel=sessions, sandboxes=sandboxes,
                     cell_images=CellImages(workspaces, settings.max_image_bytes, settings.max_cell_images)),
        FileTools(workspaces, settings.max_file_read_bytes, settings.workspace_quota,
                  max_image_bytes=settings.max_image_bytes),
        SearchTools(workspaces),
        WebTools(settings.web, AddressPolicy.parse(settings.web.allow_private, settings.web.allowed_endpoints), tracer),
    ]
    if settings.background_per_session:
        providers.append(background)
    providers += list(extra_providers)
    core = ToolService(providers, workspaces, settings.max_arguments_bytes,
                       background=background if settings.background_per_session else None,
                       max_image_bytes=settings.max_image_bytes)
    core.session_sandboxes = sandboxes
    core.templates = settings.templates
    core.sandboxes = sandboxes
    return core


def _session_pods(executor: Executor):
    """The cluster's session pods (k8s_session.py), ended with their workspace like local session jails."""
    from agentmesh.tools.sandbox.k8s_session import KubernetesSessionPods

    return executor if isinstance(executor, KubernetesSessionPods) else None


def session_depth_reader(memory):
    """How deep in a chain of A2A agents a session is (its `agentmesh.a2a.depth` label; 0 for a
    session a person started, or none at all)."""
    async def depth(session_id: str) -> int:
        try:
            session = await memory.GetSession(sessions_pb2.GetSessionRequest(session_id=session_id), timeout=10)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND:
                return 0
            raise
        value = session.labels.get(DEPTH_KEY, "0")
        return int(value) if value.isdigit() else 0

    return depth


async def build(settings: Settings, telemetry: Telemetry, address: str | None = None) -> ServiceHost:
    tools_settings = ToolsSettings.from_settings(settings)
    tools_settings.workspace_root.mkdir(parents=True, exist_ok=True)
    owner = None
    if tools_settings.mode == "local" and not tools_settings.unsafe_no_isolation:
        from agentmesh.tools.sandbox.local import jail_host_identity

        owner = jail_host_identity(tools_settings)
    workspaces = Workspaces(tools_settings.workspace_root, owner)
    executor = make_executor(tools_settings.for_template(tools_settings.templates.default), workspaces, telemetry)
    if (session_pods := _session_pods(executor)) is not None:
        session_pods.start()  # the warm pool fills before the first session asks
    from agentmesh.tools.sandbox.session import SessionSandboxes

    # stdio MCP servers run in jails of their own (one per server), session sandboxes or not.
    connections = ConnectionFactory(tools_settings, executor.jail if isinstance(executor, SessionSandboxes) else executor,
                                    owner)
    await connections.start()
    mcp_tools = build_mcp_tools(tools_settings, connections, telemetry.tracer)
    if mcp_tools is not None:
        await start_mcp_tools(mcp_tools, connections)
    identity = ServiceIdentity.open("tools", settings.keys_dir)
    # One channel and one client to the memory service, for everything this service asks it: the
    # namespaces' MCP servers, a session's tenant, how deep in a chain of agents a session is.
    memory_channel = open_channel(settings.address_of("memory"), telemetry, identity=identity, audience="memory")
    memory = MemoryClient(memory_channel, settings.address_of("memory"))

    def open_session_depth():
        # Only with remote A2A agents: how deep in a chain of agents the calling session is.
        return session_depth_reader(memory.stub)

    a2a_tools = build_a2a_tools(tools_settings, open_session_depth)
    if a2a_tools is not None:
        await a2a_tools.start()
    extra = tuple(p for p in (mcp_tools, a2a_tools) if p is not None)
    # A namespace's own servers are registered with the memory service, so every replica has them.
    namespaces = NamespaceServers(
        MemoryRegistrations(memory), connections, connections.policy,
        tools_settings.limits, tools_settings.mcp.attachment_cap_bytes, secret_source(tools_settings),
        reserved=lambda: mcp_tools.names() if mcp_tools is not None else set(),
        workdirs=connections.root / "namespaces", legacy_dir=connections.root / "namespaces", tracer=telemetry.tracer,
        sandbox=connections.sandbox)
    namespaces.start_migration()
    core = build_core(tools_settings, executor, workspaces, telemetry.tracer, extra_providers=extra,
                      build_executor=lambda template: make_executor(tools_settings.for_template(template), workspaces,
                                                                    telemetry))
    core.namespaces = namespaces
    # An Execute request is bounded by its arguments (max_arguments_bytes), an upload by
    # max_upload_bytes; the rest is small. Twice the larger still reaches the service, which
    # names the limit in its INVALID_ARGUMENT.
    largest = max(tools_settings.max_arguments_bytes, tools_settings.max_upload_bytes, tools_settings.max_image_bytes)
    host = ServiceHost("tools", settings, telemetry, address=address, identity=identity,
                       max_receive_bytes=min(2 * largest + MIB, MAX_MESSAGE_BYTES))
    # on_stop callbacks run in reverse: the executor closes last, after everything that still
    # uses it (background commands, MCP server pods) has stopped.
    host.on_stop(executor.close)
    if core.sandboxes is not None:
        host.on_stop(core.sandboxes.close)  # the other templates' executors
    tenants = None
    if settings.auth_policy.enforced:
        tenants = SessionTenants(memory, settings.auth_policy, workspaces, host.audit)
    files = WorkspaceFiles(workspaces, tools_settings.max_view_bytes, tools_settings.max_upload_bytes,
                           tools_settings.workspace_quota, max_image_bytes=tools_settings.max_image_bytes)
    servicer = ToolsServicer(host.calls, core, files, tenants)
    host.add(tools_service_pb2_grpc.add_ToolsServicer_to_server, servicer, "agentmesh.internal.v1.Tools")
    # Open carried calls' streams would hold the drain up: they end once their calls are answered.
    host.on_drain(servicer.carried_calls.close)
    host.on_drain(core.versions.close)  # open WatchCatalog streams would hold the drain up
    host.on_drain(core.background_sessions.close)  # as WatchCatalog's
    if core.background is not None:
        host.on_stop(core.background.close)  # before the executor: stop what still runs
    if mcp_tools is not None:
        host.on_stop(mcp_tools.close)
    host.on_stop(namespaces.close)
    host.on_stop(memory_channel.close)
    return host
