"""gRPC adapter of the gateway: the public API's servicer, authentication of each call and session
routing between replicas (its wiring: wiring.py)."""

from __future__ import annotations

import contextlib
from typing import Awaitable, Callable

from agentmesh import error_reasons
from agentmesh.agent_manifest import CONTROLLER_SUBJECT
from agentmesh.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied, Unavailable
from agentmesh.gateway.authz import Authorizer, Caller
from agentmesh.gateway.core import Gateway
from agentmesh.gateway.forwarding import OwnerUnreachable, SessionRouter, was_routed
from agentmesh.gateway.learning import MemoryLearning
from agentmesh.gateway.live import merged
from agentmesh.gateway.namespace_rpcs import NamespaceRecordRpcs
from agentmesh.gateway.namespace_rpcs import current_caller as _caller
from agentmesh.gateway.reflect import AgentReflect
from agentmesh.gateway.resources import Resources
from agentmesh.gateway.retention import RetentionDriver
from agentmesh.gateway.run_rpcs import RunRpcs, validate_join, validate_run_id
from agentmesh.gateway.team_rpcs import TeamRpcs
from agentmesh.gateway.usage import UsageReports
from agentmesh.gateway.webhooks import Webhooks
from agentmesh.ids import validate_id
from agentmesh.logs import get_logger
from agentmesh.rpc.errors import translate_errors
from agentmesh.v1 import gateway_pb2, gateway_pb2_grpc, sessions_pb2

log = get_logger("agentmesh.gateway")


def _is_service(caller: Caller, service: str) -> bool:
    """The call is `service` acting on its own (its signed token, no person behind it)."""
    return caller.principal is not None and caller.principal.subject == f"service:{service}"


class GatewayServicer(NamespaceRecordRpcs, TeamRpcs, gateway_pb2_grpc.GatewayServicer):
    def __init__(self, core: Gateway, resources: Resources, usage: UsageReports, router: SessionRouter | None = None,
                 reflect: AgentReflect | None = None, learning: MemoryLearning | None = None,
                 authz: Authorizer | None = None, runs: RunRpcs | None = None,
                 webhook_secret: Callable[[str], Awaitable[str]] | None = None, webhooks: Webhooks | None = None,
                 retention: RetentionDriver | None = None):
        # authz: who may touch which session and namespace (authz.py); None only without a memory
        # service to ask (then only the learning RPCs, which need one anyway, would use it).
        self._core = core
        self._resources = resources
        self._usage = usage
        self._reflect = reflect
        self._learning = learning
        self._authz = authz
        self._runs = runs or RunRpcs(core, authz or Authorizer(_NoSessions()))
        self._webhook_secret = webhook_secret
        self._webhooks = webhooks
        self._retention = retention
        # None: a single gateway, every session served here.
        self._router = router

    async def _route(self, session_id: str, context) -> str | None:
        return await self._router.target(session_id, context) if self._router else None

    async def _forwarded(self, method: str, request, context):
        """The owner's reply when another replica serves the session; None to serve it here."""
        owner = await self._route(validate_id(request.session_id), context)
        if owner is None or self._router is None:
            return None
        try:
            return await self._router.forwarder.unary(owner, method, request, context)
        except OwnerUnreachable as exc:
            log.warning("owning gateway unreachable; serving here", method=method,
                        session_id=request.session_id, owner=owner, error=str(exc))
            return None

    @translate_errors
    async def CreateSession(self, request, context):
        return await self._core.create_session(request, _caller())

    @translate_errors
    async def GetSession(self, request, context):
        return await self._core.get_session(request.session_id, _caller())

    @translate_errors
    async def ListSessions(self, request, context):
        return await self._core.list_sessions(request.page_size, request.page_token)

    @translate_errors
    async def DeleteSession(self, request, context):
        # The owner knows whether a turn runs, and refuses while one does.
        if (reply := await self._forwarded("DeleteSession", request, context)) is not None:
            return reply
        return sessions_pb2.DeleteSessionResponse(deleted=await self._core.delete_session(request.session_id, _caller()))

    @translate_errors
    async def Chat(self, request, context):
        self._core.validate_chat(request)  # bad input is refused here, without a hop
        owner = await self._route(request.session_id, context)
        if owner is not None and self._router is not None:
            try:
                async with contextlib.aclosing(self._router.forwarder.chat(owner, request, context)) as events:
                    async for event in events:
                        yield event
                return
            except OwnerUnreachable as exc:
                # The owner is gone (or going): better to serve the turn than to refuse it.
                log.warning("owning gateway unreachable; serving the turn here",
                            session_id=request.session_id, owner=owner, error=str(exc))
        async for event in self._core.chat(request, _caller()):
            yield event

    @translate_errors
    async def AttachTurn(self, request, context):
        validate_id(request.session_id)
        owner = await self._route(request.session_id, context)
        if owner is not None and self._router is not None:
            try:
                async with contextlib.aclosing(self._router.forwarder.chat(owner, request, context, "AttachTurn")) as events:
                    async for event in events:
                        yield event
                return
            except OwnerUnreachable as exc:
                log.warning("owning gateway unreachable; attaching here", session_id=request.session_id,
                            owner=owner, error=str(exc))
        async for event in self._core.attach(request.session_id, request.after_seq, _caller()):
            yield event

    # --- runs (run_rpcs.py): served by the replica that runs the run's session ---------------

    async def _run_owner(self, run_id: str, context) -> str | None:
        """The replica to serve a call on run `run_id`: None when this one runs (or ran) it or
        owns its session; otherwise the owner of the session its record names."""
        if self._router is None or self._core.runs.local(validate_run_id(run_id)) is not None or was_routed(context):
            return None
        run = await self._core.runs.get(run_id)
        return await self._route(run.session_id, context)

    @translate_errors
    async def CreateRun(self, request, context):
        self._core.validate_chat(gateway_pb2.ChatRequest(session_id=request.session_id, message=request.message,
                                                         options=request.options))
        if (reply := await self._forwarded("CreateRun", request, context)) is not None:
            return reply
        return await self._runs.create(request, _caller())

    @translate_errors
    async def GetRun(self, request, context):
        if (owner := await self._run_owner(request.run_id, context)) is not None and self._router is not None:
            with contextlib.suppress(OwnerUnreachable):
                return await self._router.forwarder.unary(owner, "GetRun", request, context)
        return await self._runs.get(request.run_id, _caller())

    @translate_errors
    async def ListRuns(self, request, context):
        return await self._runs.list(request, _caller())

    @translate_errors
    async def JoinRun(self, request, context):
        validate_join(request.run_id, request.after_seq)  # refused here, without a hop
        owner = await self._run_owner(request.run_id, context)
        if owner is not None and self._router is not None:
            try:
                async with contextlib.aclosing(self._router.forwarder.chat(owner, request, context, "JoinRun")) as events:
                    async for event in events:
                        yield event
                return
            except OwnerUnreachable as exc:
                log.warning("owning gateway unreachable; joining here", run_id=request.run_id, owner=owner, error=str(exc))
        async for event in self._runs.join(request.run_id, request.after_seq, _caller()):
            yield event

    @translate_errors
    async def CancelRun(self, request, context):
        if (owner := await self._run_owner(request.run_id, context)) is not None and self._router is not None:
            with contextlib.suppress(OwnerUnreachable):
                return await self._router.forwarder.unary(owner, "CancelRun", request, context)
        return await self._runs.cancel(request.run_id, _caller())

    @translate_errors
    async def GetWebhookSecret(self, request, context):
        if self._authz is None or self._webhook_secret is None:
            raise Unavailable("webhooks are not wired in this gateway")
        namespace = self._authz.namespace(_caller(), request.namespace, "GetWebhookSecret")
        return sessions_pb2.WebhookSecret(namespace=namespace, secret=await self._webhook_secret(namespace))

    @translate_errors
    async def GetNamespaceWebhook(self, request, context):
        if self._authz is None or self._webhooks is None:
            raise Unavailable("webhooks are not wired in this gateway")
        namespace = self._authz.namespace(_caller(), request.namespace, "GetNamespaceWebhook")
        return sessions_pb2.NamespaceWebhook(namespace=namespace, default_url=await self._webhooks.default_url(namespace))

    @translate_errors
    async def SetNamespaceWebhook(self, request, context):
        if self._authz is None or self._webhooks is None:
            raise Unavailable("webhooks are not wired in this gateway")
        namespace = self._authz.namespace(_caller(), request.namespace, "SetNamespaceWebhook")
        url = await self._webhooks.set_default_url(namespace, request.default_url)
        self._authz.audit.record("webhook.set_default", "allowed", _caller().principal, namespace=namespace)
        return sessions_pb2.NamespaceWebhook(namespace=namespace, default_url=url)

    @translate_errors
    async def WatchActivity(self, request, context):
        scope = _caller().scope
        local = self._core.live.watch(list(request.session_ids), lambda namespace: scope.visible(namespace, "viewer"))
        if self._router is None or was_routed(context):
            async for activity in local:
                yield activity
            return
        # Every replica runs its own sessions' turns: ask each of the others for theirs too.
        others = [peer for peer in self._router.membership.peers if peer != self._core.live.replica]
        async for activity in merged([local, *(self._router.forwarder.watch(p, request, context) for p in others)]):
            yield activity

    @translate_errors
    async def Cancel(self, request, context):
        return await self._cancel_anywhere(request, context)

    async def _cancel_anywhere(self, request, context) -> gateway_pb2.CancelResponse:
        """Cancel the session's turn on the replica that owns it (Cancel; team_rpcs.py's StopTeammates)."""
        if (reply := await self._forwarded("Cancel", request, context)) is not None:
            return reply
        cancelled, run_id = await self._core.cancel(request.session_id, _caller())
        return gateway_pb2.CancelResponse(cancelled=cancelled, run_id=run_id)

    @translate_errors
    async def Approve(self, request, context):
        if (reply := await self._forwarded("Approve", request, context)) is not None:
            return reply
        run_id = await self._core.approve(request, _caller())
        return gateway_pb2.ApproveResponse(accepted=True, run_id=run_id)

    @translate_errors
    async def ListApprovals(self, request, context):
        if (reply := await self._forwarded("ListApprovals", request, context)) is not None:
            return reply
        return await self._core.pending_approvals(request.session_id, _caller())

    @translate_errors
    async def UpdateSession(self, request, context):
        return await self._core.update_session(request, _caller())

    @translate_errors
    async def ListModels(self, request, context):
        return await self._core.list_models(request.namespace, _caller())

    @translate_errors
    async def GetUsage(self, request, context):
        scope = _caller().scope
        return await self._usage.report(request, lambda namespace: scope.visible(namespace, "viewer"))

    @translate_errors
    async def GetTranscript(self, request, context):
        return await self._core.transcript(request.session_id, request.page_size, request.after_seq, _caller())

    @translate_errors
    async def ListModelCalls(self, request, context):
        return await self._core.model_calls(request.session_id, request.run_id, _caller())

    # Workspaces, memory, the catalog and the span store are shared by every replica: served here.

    @translate_errors
    async def ListTools(self, request, context):
        return await self._resources.list_tools(request, _caller())

    @translate_errors
    async def ClearTranscript(self, request, context):
        # The owner knows whether a turn runs, and refuses while one does.
        if (reply := await self._forwarded("ClearTranscript", request, context)) is not None:
            return reply
        return sessions_pb2.ClearTranscriptResponse(cleared=await self._core.clear_transcript(request.session_id, _caller()))

    @translate_errors
    async def ForkSession(self, request, context):
        # Served on any replica: the fork reads the source's stored transcript and workspace.
        return await self._core.fork_session(request, _caller())

    @translate_errors
    async def GetNamespaceSettings(self, request, context):
        return await self._core.namespace_settings(request.namespace, _caller())

    @translate_errors
    async def UpdateNamespaceSettings(self, request, context):
        caller = _caller()
        if (request.HasField("models") and self.managed_agent_namespaces and self._authz is not None
                and caller.subject != CONTROLLER_SUBJECT):
            namespace = self._authz.namespace(caller, request.namespace, "UpdateNamespaceSettings")
            if namespace in self.managed_agent_namespaces:
                # One source of truth: the controller's next pass would put back what the resources say.
                raise FailedPrecondition(
                    f"the models of namespace {namespace!r} are defined by Kubernetes ModelConfig resources; "
                    "change them with kubectl (or in Git), not through the API",
                    reason=error_reasons.AGENTS_FROM_RESOURCES, metadata={"namespace": namespace})
        return await self._core.update_namespace_settings(request, caller)

    @translate_errors
    async def AddMcpServer(self, request, context):
        return await self._resources.add_mcp_server(request, _caller())

    @translate_errors
    async def ListMcpServers(self, request, context):
        return await self._resources.list_mcp_servers(request, _caller())

    @translate_errors
    async def RemoveMcpServer(self, request, context):
        return await self._resources.remove_mcp_server(request, _caller())

    @translate_errors
    async def SearchMemory(self, request, context):
        return await self._resources.search_memory(request, _caller())

    @translate_errors
    async def ListWorkspace(self, request, context):
        return await self._resources.list_workspace(request, _caller())

    @translate_errors
    async def ReadWorkspaceFile(self, request, context):
        return await self._resources.read_workspace_file(request, _caller())

    @translate_errors
    async def WriteWorkspaceFile(self, request, context):
        return await self._resources.write_workspace_file(request, _caller())

    # --- retention and erasure (retention.py) ---

    def _retention_driver(self) -> RetentionDriver:
        if self._retention is None or self._authz is None:
            raise FailedPrecondition("this gateway has no memory service to apply retention with")
        return self._retention

    @translate_errors
    async def SweepRetention(self, request, context):
        driver, caller = self._retention_driver(), _caller()
        if request.namespace:
            request.namespace = self._authz.namespace(caller, request.namespace, "SweepRetention")  # type: ignore[union-attr]  # build() always gives an authorizer
        elif not (caller.scope.unrestricted or _is_service(caller, "scheduler")):
            raise PermissionDenied("sweeping every namespace needs admin of every namespace; name one (namespace)",
                                   field="namespace")
        return await driver.sweep(request, caller.principal)

    @translate_errors
    async def EraseUser(self, request, context):
        driver, caller = self._retention_driver(), _caller()
        namespace = self._authz.namespace(caller, request.namespace, "EraseUser")  # type: ignore[union-attr]  # build() always gives an authorizer
        if not request.user.strip():
            raise InvalidArgument("user is empty: name the principal to erase, e.g. 'user:alice' "
                                  "(a session's created_by)", field="user")
        erased = await driver.erase_user(namespace, request.user, caller.principal)
        if not erased.done:
            raise FailedPrecondition(
                f"erased {len(erased.sessions)} sessions and {erased.memories_removed} memories of {request.user!r}, "
                "but some of their sessions have a turn running: cancel those turns and erase again",
                reason=error_reasons.SESSION_BUSY, metadata={"user": request.user})
        return erased

    @translate_errors
    async def GetTrace(self, request, context):
        return await self._resources.get_trace(request.trace_id, _caller())


class _NoSessions:
    """A servicer built without an authorizer (tests of other RPCs): no session is found."""

    async def get_session(self, session_id: str) -> sessions_pb2.Session:
        raise NotFound(f"session {session_id!r} does not exist")
