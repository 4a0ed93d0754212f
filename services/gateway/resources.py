"""What a client can look at besides turns: the tool catalog, long-term memory, a session's
workspace, and a turn's trace. The gateway validates and authorises; the owners (tools, memory,
the span store) do the work behind the ports below.

Plain async Python, like `core.py`: it raises `agentmesh.errors` exceptions and passes the
protobuf messages of the public API along as data.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from google.protobuf import struct_pb2

from agentmesh.errors import FailedPrecondition, InvalidArgument, NotFound
from agentmesh.gateway.authz import ANYONE, Authorizer, Caller
from agentmesh.gateway.policy import Policies
from agentmesh.ids import validate_id, validate_namespace
from agentmesh.telemetry.traceview import AmbiguousTraceId, TraceNotFound, TraceView, normalize_trace_id
from agentmesh.v1 import gateway_pb2, sessions_pb2, tools_pb2

MAX_QUERY_CHARS = 4000
MAX_SEARCH_RESULTS = 100
MAX_KINDS = 32


class ToolCatalog(Protocol):
    async def list_tools(self, namespace: str = "") -> tools_pb2.ListToolsResponse: ...
    async def add_mcp_server(self, request: tools_pb2.AddMcpServerRequest) -> tools_pb2.McpServerStatus: ...
    async def list_mcp_servers(self, request: tools_pb2.ListMcpServersRequest) -> tools_pb2.ListMcpServersResponse: ...
    async def remove_mcp_server(self, request: tools_pb2.RemoveMcpServerRequest) -> tools_pb2.RemoveMcpServerResponse: ...


class WorkspaceFiles(Protocol):
    async def list_workspace(self, request: tools_pb2.ListWorkspaceRequest) -> tools_pb2.ListWorkspaceResponse: ...
    async def read_workspace_file(self, request: tools_pb2.ReadWorkspaceFileRequest) -> tools_pb2.ReadWorkspaceFileResponse: ...
    async def write_workspace_file(self, request: tools_pb2.WriteWorkspaceFileRequest) -> tools_pb2.WriteWorkspaceFileResponse: ...


class MemorySearch(Protocol):
    async def search(self, namespace: str, query: str, k: int, kinds: list[str]) -> gateway_pb2.SearchMemoryResponse: ...


class SessionLookup(Protocol):
    async def get_session(self, session_id: str) -> sessions_pb2.Session: ...


class TraceStore(Protocol):
    def load(self, trace_id: str) -> TraceView: ...

    @property
    def where(self) -> object | None:
        """Where spans are kept; None when not locally (they go to a collector, or nowhere)."""
        ...


class Resources:
    def __init__(self, sessions: SessionLookup, tools: ToolCatalog, files: WorkspaceFiles,
                 memory: MemorySearch, traces: TraceStore, max_upload_bytes: int, policies: Policies,
                 authz: Authorizer | None = None):
        self._sessions = sessions
        self._policies = policies
        self._authz = authz or Authorizer(sessions)
        self._tools = tools
        self._files = files
        self._memory = memory
        self._traces = traces
        self._max_upload_bytes = max_upload_bytes

    async def list_tools(self, request: tools_pb2.ListToolsRequest, caller: Caller = ANYONE) -> tools_pb2.ListToolsResponse:
        """The catalog as the policies leave it: the deployment's, and with a session (or a
        namespace) theirs too."""
        session = None
        if request.session_id:
            session = await self._authz.session(caller, validate_id(request.session_id), "ListTools")
            if request.namespace and request.namespace != session.namespace:
                raise InvalidArgument(f"session {request.session_id!r} is in namespace {session.namespace!r}, "
                                      f"not {request.namespace[:64]!r}: give one of the two")
        if request.namespace:
            validate_namespace(request.namespace)
            self._authz.namespace(caller, request.namespace, "ListTools")
        # The namespace's own MCP servers' tools join the catalog (then the policies apply to them too).
        namespace = request.namespace or (session.namespace if session is not None else "")
        catalog = await self._tools.list_tools(namespace)
        if session is None and not request.namespace:
            layers = [self._policies.deployment]
        else:
            layers = await self._policies.layers(session, request.namespace)
        return tools_pb2.ListToolsResponse(tools=self._policies.filter(catalog.tools, layers),
                                           unavailable_mcp_servers=catalog.unavailable_mcp_servers)

    async def add_mcp_server(self, request: tools_pb2.AddMcpServerRequest,
                             caller: Caller = ANYONE) -> tools_pb2.McpServerStatus:
        validate_namespace(request.namespace)
        self._authz.namespace(caller, request.namespace, "AddMcpServer")
        if not request.server.name:
            raise InvalidArgument("server.name is required: 1-32 letters, digits or '-'")
        if bool(request.server.command) == bool(request.server.url):
            raise InvalidArgument("give exactly one of server.command (a stdio server) or server.url (streamable HTTP)")
        return await self._tools.add_mcp_server(request)

    async def list_mcp_servers(self, request: tools_pb2.ListMcpServersRequest,
                               caller: Caller = ANYONE) -> tools_pb2.ListMcpServersResponse:
        validate_namespace(request.namespace)
        self._authz.namespace(caller, request.namespace, "ListMcpServers")
        return await self._tools.list_mcp_servers(request)

    async def remove_mcp_server(self, request: tools_pb2.RemoveMcpServerRequest,
                                caller: Caller = ANYONE) -> tools_pb2.RemoveMcpServerResponse:
        validate_namespace(request.namespace)
        self._authz.namespace(caller, request.namespace, "RemoveMcpServer")
        if not request.name:
            raise InvalidArgument("name is required")
        return await self._tools.remove_mcp_server(request)

    async def search_memory(self, request: gateway_pb2.SearchMemoryRequest,
                            caller: Caller = ANYONE) -> gateway_pb2.SearchMemoryResponse:
        if request.namespace:
            validate_namespace(request.namespace)
        namespace = self._authz.namespace(caller, request.namespace, "SearchMemory")
        if not request.query.strip():
            raise InvalidArgument("query is empty: give the words to look for")
        if len(request.query) > MAX_QUERY_CHARS:
            raise InvalidArgument(f"query is {len(request.query)} characters; at most {MAX_QUERY_CHARS}")
        if request.k < 0 or request.k > MAX_SEARCH_RESULTS:
            raise InvalidArgument(f"k must be between 0 and {MAX_SEARCH_RESULTS}, got {request.k}")
        if len(request.kinds) > MAX_KINDS or any(not kind.strip() or len(kind) > 64 for kind in request.kinds):
            raise InvalidArgument(f"kinds: at most {MAX_KINDS} names of 1-64 characters")
        return await self._memory.search(namespace, request.query, request.k or 5, list(request.kinds))

    # --- a session's workspace: the session must exist, so no workspace is made for a stray id ---

    async def list_workspace(self, request: tools_pb2.ListWorkspaceRequest,
                             caller: Caller = ANYONE) -> tools_pb2.ListWorkspaceResponse:
        await self._authz.session(caller, request.session_id, "ListWorkspace")
        return await self._files.list_workspace(request)

    async def read_workspace_file(self, request: tools_pb2.ReadWorkspaceFileRequest,
                                  caller: Caller = ANYONE) -> tools_pb2.ReadWorkspaceFileResponse:
        await self._authz.session(caller, request.session_id, "ReadWorkspaceFile")
        if not request.path.strip():
            raise InvalidArgument("path is required: which file of the workspace to read")
        return await self._files.read_workspace_file(request)

    async def write_workspace_file(self, request: tools_pb2.WriteWorkspaceFileRequest,
                                   caller: Caller = ANYONE) -> tools_pb2.WriteWorkspaceFileResponse:
        if len(request.content) > self._max_upload_bytes:
            raise InvalidArgument(
                f"the file is {len(request.content)} bytes; uploads are limited to {self._max_upload_bytes} bytes"
            )
        await self._authz.session(caller, request.session_id, "WriteWorkspaceFile")
        return await self._files.write_workspace_file(request)

    # --- traces -------------------------------------------------------------------------------

    async def get_trace(self, trace_id: str, caller: Caller = ANYONE) -> gateway_pb2.Trace:
        try:
            wanted = normalize_trace_id(trace_id)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        if self._traces.where is None:
            raise FailedPrecondition(
                "traces are not kept locally (AGENTMESH_TRACES is not 'local'): read them in your "
                "tracing backend (Jaeger, Tempo, Grafana)"
            )
        try:
            view = await asyncio.to_thread(self._traces.load, wanted)
        except TraceNotFound:
            raise NotFound(
                f"no trace {wanted} in the local span store (yet: spans are written a moment after a turn ends)"
            ) from None
        except AmbiguousTraceId as exc:
            raise InvalidArgument(str(exc)) from None
        await self._may_see(view, caller, wanted)
        return trace_message(view)

    async def _may_see(self, view: TraceView, caller: Caller, wanted: str) -> None:
        """A trace is as visible as the session its turn ran in; one naming no session (a
        service's own work) only where tenants are not configured."""
        if caller.scope.unrestricted:
            return
        missing = f"no trace {wanted} in the local span store (yet: spans are written a moment after a turn ends)"
        sessions = {str(attrs[key]) for node, _depth, _lasts in view.walk()
                    if (attrs := node.span.get("attributes") or {})
                    for key in ("agentmesh.session_id", "gen_ai.conversation.id") if attrs.get(key)}
        if not sessions:
            raise NotFound(missing)
        for session_id in sorted(sessions):
            try:
                await self._authz.session(caller, session_id, "GetTrace")
            except NotFound:
                raise NotFound(missing) from None


def trace_message(view: TraceView) -> gateway_pb2.Trace:
    spans = []
    for node, depth, _lasts in view.walk():
        span = node.span
        attributes = struct_pb2.Struct()
        attributes.update({k: v for k, v in (span.get("attributes") or {}).items() if v is not None})
        spans.append(
            gateway_pb2.TraceSpan(
                span_id=span.get("span_id", ""),
                parent_span_id=span.get("parent_span_id", ""),
                name=span.get("name", ""),
                service=span.get("service", ""),
                start=span.get("start", 0.0),
                end=span.get("end", 0.0),
                status=span.get("status", "OK"),
                status_message=span.get("status_message", ""),
                attributes=attributes,
                depth=depth,
                orphan=node.orphan,
            )
        )
    return gateway_pb2.Trace(trace_id=view.trace_id, spans=spans, start=view.start, end=view.end)
