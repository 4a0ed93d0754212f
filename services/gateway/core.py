"""The gateway's core: sessions, one turn at a time per session, relaying a run's events.

Plain async Python. It speaks to its peers through the narrow ports below and raises
`agentmesh.errors` exceptions; `server.py` turns those into gRPC statuses. The protobuf
messages it passes along are data only: the gateway relays the agent's events unchanged.
"""

from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator, Iterable

import structlog

from agentmesh import error_reasons
from agentmesh.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied, Unavailable
from agentmesh.gateway.authz import ANYONE, Authorizer, Caller
from agentmesh.gateway.limits import TenantLimiter
from agentmesh.gateway.live import LiveTurns
from agentmesh.gateway.policy import Policies, policy_to_proto
from agentmesh.gateway.ports import AgentRunner, SessionStore, Workspaces
from agentmesh.gateway.runs import RunLedger
from agentmesh.gateway.settings import GatewaySettings
from agentmesh.gateway.turns import RunningTurn, SessionTurns, relay
from agentmesh.ids import new_id, validate_id, validate_namespace
from agentmesh.images import validate_images
from agentmesh.internal.v1 import agent_service_pb2
from agentmesh.logs import get_logger
from agentmesh.models import DEFAULT_MODEL, ModelCatalog, ModelSpec
from agentmesh.toolpolicy import validate_permission_mode
from agentmesh.turn_input import TurnLimits, validate_turn
from agentmesh.v1 import common_pb2, gateway_pb2, sessions_pb2

log = get_logger("agentmesh.gateway")

MAX_PAGE_SIZE = 500
MAX_CALL_ID_CHARS = 256
MAX_NOTE_CHARS = 4000
MAX_EDITED_ARGUMENTS_CHARS = 256 * 1024  # as the tools service's AGENTMESH_TOOLS_MAX_ARGUMENTS_BYTES default
SESSION_FIELDS = ("model", "permission_mode", "tools", "sandbox_template", "record_model_calls")  # what UpdateSession can change


class Gateway:
    def __init__(self, sessions: SessionStore, agent: AgentRunner, workspaces: Workspaces, settings: GatewaySettings,
                 policies: Policies, models: ModelCatalog | None = None, authz: Authorizer | None = None,
                 limits: TenantLimiter | None = None, live: LiveTurns | None = None, runs: RunLedger | None = None):
        self._sessions = sessions
        self._policies = policies
        # Who may touch what (authz.py), and the per-tenant limits on turns and tokens.
        self._authz = authz or Authorizer(sessions)
        self._limits = limits or TenantLimiter(None)
        # The models a turn or a session may name (AGENTMESH_MODELS and the default).
        self._models = models or ModelCatalog.of(ModelSpec(DEFAULT_MODEL, "scripted", "", "scripted"), {})
        self._agent = agent
        self._workspaces = workspaces
        self._settings = settings
        self._turn_limits = TurnLimits(settings.max_message_chars, settings.max_iterations_cap)
        # The deployment's tool policy goes with every turn; it is fixed at start-up.
        self._deployment_tools = policy_to_proto(policies.deployment)
        # One turn per session in this replica (turns.py).
        self._turns = SessionTurns()
        self._draining = False
        # The running turns' events, for clients attaching to them and operators watching.
        self.live = live or LiveTurns()
        # Every turn is a run, recorded off the turn's critical path (runs.py).
        self.runs = runs or RunLedger()

    # --- sessions -------------------------------------------------------------------------

    async def create_session(self, request: gateway_pb2.CreateSessionRequest, caller: Caller = ANYONE) -> sessions_pb2.Session:
        session_id = validate_id(request.session_id) if request.session_id else new_id("s")
        if request.namespace:
            validate_namespace(request.namespace)
        namespace = self._authz.namespace(caller, request.namespace, "CreateSession")
        session = self._new_session(session_id, request.title, dict(request.labels), namespace)
        stored, created = await self._sessions.put_session(session)
        if created:
            self._authz.audit.record("session.create", "allowed", caller.principal, session_id=session_id,
                                     namespace=stored.namespace)
        return stored

    async def get_session(self, session_id: str, caller: Caller = ANYONE) -> sessions_pb2.Session:
        return await self._authz.session(caller, session_id, "GetSession")

    async def list_sessions(self, page_size: int, page_token: str) -> sessions_pb2.ListSessionsResponse:
        if page_size < 0 or page_size > MAX_PAGE_SIZE:
            raise InvalidArgument(f"page_size must be between 0 and {MAX_PAGE_SIZE}, got {page_size}", field="page_size")
        return await self._sessions.list_sessions(page_size or 50, page_token)

    async def update_session(self, request: sessions_pb2.UpdateSessionRequest, caller: Caller = ANYONE) -> sessions_pb2.Session:
        """Change a session's model, permission mode, tool policy, sandbox template or model-call
        recording (which: see sessions.proto)."""
        validate_id(request.session_id)
        unknown = [path for path in request.update_mask if path not in SESSION_FIELDS]
        if unknown:
            raise InvalidArgument(f"update_mask: {unknown[0][:64]!r} cannot be changed; name any of {', '.join(SESSION_FIELDS)}",
                                  field="update_mask")
        validate_permission_mode(request.permission_mode)
        if request.HasField("tools") or "tools" in request.update_mask:
            await self._policies.checked(request.tools, "tools")
        if request.sandbox_template:
            await self._policies.checked_template(request.sandbox_template)
        session = await self._authz.session(caller, request.session_id, "UpdateSession")
        if request.model and self._models.get(request.model) is None:
            # Not the deployment's: one of the session's namespace's own models, else refused.
            settings = await self._policies.namespace_settings(session.namespace)
            if not any(m.name == request.model for m in settings.models):
                raise InvalidArgument(self._models.unknown_model_message(request.model, "model"), field="model",
                                      reason=error_reasons.UNKNOWN_MODEL, metadata={"model": request.model[:80]})
        return await self._sessions.update_session(request)

    async def clear_transcript(self, session_id: str, caller: Caller = ANYONE) -> int:
        """Empty the session's transcript (and with it its task board and token count); the
        session, its workspace and its namespace's long-term memory stay."""
        validate_id(session_id)
        await self._authz.session(caller, session_id, "ClearTranscript")
        if session_id in self._turns:
            raise FailedPrecondition(f"session {session_id!r} has a turn running; cancel it first",
                                     reason=error_reasons.SESSION_BUSY, metadata={"session_id": session_id})
        cleared = await self._sessions.clear_transcript(session_id)
        self._authz.audit.record("session.clear", "allowed", caller.principal, session_id=session_id)
        return cleared

    async def fork_session(self, request: sessions_pb2.ForkSessionRequest,
                           caller: Caller = ANYONE) -> sessions_pb2.ForkSessionResponse:
        """Time travel: a new session with the source's transcript up to `at_seq` and a copy of its
        workspace as it is now. Checked before anything is written (the source is the caller's, the
        seq is in it); a workspace that cannot be copied removes the fork again."""
        source = await self._authz.session(caller, request.session_id, "ForkSession")
        if request.at_seq < 1 or request.at_seq > source.message_count:
            held = f"messages 1 to {source.message_count}" if source.message_count else "no messages"
            raise InvalidArgument(f"at_seq {request.at_seq} is not a message of session {request.session_id!r}, "
                                  f"which holds {held}", field="at_seq", reason=error_reasons.SEQ_OUT_OF_RANGE,
                                  metadata={"at_seq": str(request.at_seq), "message_count": str(source.message_count)})
        new_session_id = validate_id(request.new_session_id, "new_session_id") if request.new_session_id else new_id("s")
        forked = await self._sessions.fork_session(sessions_pb2.ForkSessionRequest(
            session_id=request.session_id, at_seq=request.at_seq, new_session_id=new_session_id, title=request.title))
        try:
            files, size = await self._workspaces.copy_workspace(request.session_id, new_session_id)
        except BaseException:
            tenant = caller.scope.tenant_of(source.namespace or "default") or ""
            await asyncio.shield(self._sessions.undo_fork(new_session_id, tenant))
            raise
        forked.workspace_files, forked.workspace_bytes = files, size
        self._authz.audit.record("session.fork", "allowed", caller.principal, session_id=request.session_id,
                                 new_session_id=new_session_id, at_seq=request.at_seq)
        return forked

    async def namespace_settings(self, namespace: str, caller: Caller = ANYONE) -> sessions_pb2.NamespaceSettings:
        # "" is the caller's own namespace ("default" without tenants); another tenant's is refused.
        return await self._policies.namespace_settings(self._authz.namespace(caller, namespace, "GetNamespaceSettings"))

    async def update_namespace_settings(self, request: sessions_pb2.UpdateNamespaceSettingsRequest,
                                        caller: Caller = ANYONE) -> sessions_pb2.NamespaceSettings:
        namespace = self._authz.namespace(caller, request.namespace, "UpdateNamespaceSettings")
        checked = sessions_pb2.UpdateNamespaceSettingsRequest(namespace=namespace, tools=request.tools)
        if request.HasField("retention"):
            checked.retention.CopyFrom(request.retention)
        if request.HasField("sandbox_template"):
            checked.sandbox_template = request.sandbox_template
        if request.HasField("models"):
            self._check_namespace_models(request.models.models)
            checked.models.CopyFrom(request.models)
        updated = await self._policies.update_namespace_settings(checked)
        self._authz.audit.record("tool_policy.update", "allowed", caller.principal, namespace=namespace)
        if request.HasField("models"):
            self._authz.audit.record("models.update", "allowed", caller.principal, namespace=namespace,
                                     models=",".join(m.name for m in request.models.models))
        return updated

    def _check_namespace_models(self, models: Iterable[sessions_pb2.NamespaceModel]) -> None:
        """A namespace's models may not take a deployment model's name (the catalogue a namespace
        sees is one list), and fall back only to a model it sees; memory checks the rest."""
        own = {m.name for m in models}
        for m in models:
            if self._models.get(m.name) is not None or m.name == DEFAULT_MODEL:
                raise InvalidArgument(f"model {m.name[:80]!r} is a model of the deployment; a namespace's own model "
                                      "needs a name of its own", field="models.name", metadata={"model": m.name[:80]})
            if m.fallback and m.fallback not in own and self._models.get(m.fallback) is None:
                raise InvalidArgument(f"model {m.name[:80]!r} falls back to {m.fallback[:80]!r}, which is neither "
                                      "one of the namespace's models nor the deployment's", field="models.fallback",
                                      reason=error_reasons.UNKNOWN_MODEL, metadata={"model": m.fallback[:80]})

    async def delete_session(self, session_id: str, caller: Caller = ANYONE) -> bool:
        validate_id(session_id)
        # NOT_FOUND (or another tenant's) before touching anything, and before saying it is busy.
        await self._authz.session(caller, session_id, "DeleteSession")
        if session_id in self._turns:
            raise FailedPrecondition(f"session {session_id!r} has a turn running; cancel it first",
                                     reason=error_reasons.SESSION_BUSY, metadata={"session_id": session_id})
        await self._workspaces.delete_workspace(session_id)
        deleted = await self._sessions.delete_session(session_id)
        self._authz.audit.record("session.delete", "allowed", caller.principal, session_id=session_id)
        return deleted

    async def transcript(self, session_id: str, page_size: int, after_seq: int,
                         caller: Caller = ANYONE) -> sessions_pb2.GetTranscriptResponse:
        validate_id(session_id)
        if page_size < 0 or page_size > 1000:
            raise InvalidArgument(f"page_size must be between 0 and 1000, got {page_size}", field="page_size")
        if after_seq < 0:
            raise InvalidArgument("after_seq must not be negative", field="after_seq")
        await self._authz.session(caller, session_id, "GetTranscript")
        return await self._sessions.list_messages(session_id, page_size or 200, after_seq)

    async def model_calls(self, session_id: str, run_id: str, caller: Caller = ANYONE) -> sessions_pb2.ListModelCallsResponse:
        validate_id(session_id)
        if run_id:
            validate_id(run_id, "run_id")
        await self._authz.session(caller, session_id, "ListModelCalls")
        return await self._sessions.list_model_calls(session_id, run_id)

    # --- turns ----------------------------------------------------------------------------

    def validate_chat(self, request: gateway_pb2.ChatRequest) -> None:
        """Everything about a chat request that can be refused before anything is written
        (agentmesh.turn_input, the rules the agent checks again). The servicer calls it once,
        before routing the turn to another replica or to `chat`."""
        # The model's form only: whether a name is the session's namespace's model is `chat`'s
        # question (_check_turn_model), once it knows the namespace.
        validate_turn(request.session_id, request.message, request.options, self._turn_limits,
                      has_images=bool(request.images))
        validate_images(request.images, max_count=self._settings.max_images, max_bytes=self._settings.max_image_bytes,
                        max_total_bytes=self._settings.max_images_total_bytes,
                        settings="AGENTMESH_GATEWAY_MAX_IMAGES, _MAX_IMAGE_BYTES, _MAX_IMAGES_TOTAL_BYTES")

    async def chat(self, request: gateway_pb2.ChatRequest, caller: Caller = ANYONE,
                   run_id: str = "") -> AsyncIterator[common_pb2.Event]:
        """Run one turn of a request `validate_chat` accepted. Refusals happen before the first
        event; the stream ends with run_finished or error. A busy session is met by the
        request's if_busy policy."""
        session_id = request.session_id
        if self._draining:
            raise Unavailable("the gateway is shutting down; retry in a moment", reason=error_reasons.SHUTTING_DOWN)
        # Someone else's session is NOT_FOUND; a new id is created in the caller's namespace. No
        # call to memory before the turn when the caller may chat in one tenant only (or tenants
        # are not configured): memory checks the session when the agent opens it, with the same
        # sentences. A caller of several tenants has the session read here, to know which
        # tenant's limits the turn counts against before anything is written.
        existing = None if self._authz.one_tenant(caller, "Chat") \
            else await self._authz.session_or_none(caller, session_id, "Chat")
        namespace = existing.namespace if existing is not None else self._authz.namespace(caller, "", "Chat")
        await self._check_turn_model(request, existing, namespace, caller)
        tenant = caller.scope.tenant_of(namespace) or ""
        turn = RunningTurn(run_id=run_id or new_id("run"), started_by=caller.subject, namespace=namespace)
        run_record = self.runs.begin(turn.run_id, session_id, namespace, caller.subject)
        failure: BaseException | None = None
        try:
            admitted = self._limits.admit(tenant)
        except BaseException as exc:
            self.runs.end(run_record, exc)
            raise
        try:
            # A running turn is checked against the caller before if_busy acts on it (locally:
            # its namespace is the session's), so another tenant's busy session answers exactly
            # as an idle one does — NOT_FOUND — whatever the policy, and its turn goes on.
            replaced = await self._turns.take(
                session_id, turn, request.options.if_busy or self._settings.if_busy,
                authorize=None if caller.scope.unrestricted
                else lambda running: self._authz.known_session(caller, session_id, running.namespace, "Chat"),
                waiting=lambda: self.runs.queued(run_record))
            if self._draining:
                raise Unavailable("the gateway is shutting down; retry in a moment", reason=error_reasons.SHUTTING_DOWN)
            if replaced is not None and replaced.superseded_as == "rolled_back":
                dropped = await self._sessions.drop_run(session_id, replaced.run_id)
                log.info("turn rolled back", session_id=session_id, run_id=replaced.run_id, dropped=dropped)
            # No call to memory here: the agent's StartTurn creates the session when missing and
            # reads it with its namespace's settings, and resolves the turn's model, permission
            # mode and tool policies from them (agent/session_open.py); run_started says the
            # session's namespace and whether the turn created it.
            run = agent_service_pb2.RunTurnRequest(
                session_id=session_id,
                run_id=turn.run_id,
                message=request.message,
                options=request.options,
                images=request.images,
                namespace=namespace,
                open_session=agent_service_pb2.SessionToOpen(
                    session=self._new_session(session_id, "", {}, namespace),
                    deployment_tools=self._deployment_tools,
                    deployment_permission_mode=self._policies.permission_mode),
            )
            feed = self.live.begin(session_id, namespace)
            self.runs.started(run_record, feed)
            with structlog.contextvars.bound_contextvars(session_id=session_id, run_id=turn.run_id):
                log.info("turn started")
                try:
                    async for event in relay(self._agent, run, turn, self._settings.turn_timeout_s):
                        kind = event.WhichOneof("payload")
                        turn.track(kind, event)
                        self.runs.observe(run_record, kind, event)
                        if kind == "run_started" and event.run_started.namespace:
                            namespace = turn.namespace = event.run_started.namespace
                            tenant = caller.scope.tenant_of(namespace) or ""
                            self.live.set_namespace(feed, namespace)
                            if event.run_started.session_created:
                                self._authz.audit.record("session.create", "allowed", caller.principal,
                                                         session_id=session_id, namespace=namespace)
                        elif kind == "run_finished":
                            self._limits.count_tokens(tenant, event.run_finished.usage.total_tokens)
                            if turn.superseded_as == "rolled_back":
                                # It may have finished on its own meanwhile; its steps go all the same.
                                event.run_finished.stop_reason = "rolled_back"
                        turn.opened.set()  # the agent opened the session: memory let the caller in
                        self.live.publish(feed, event)
                        if kind == "run_finished" or kind == "error":
                            # Free the session before the last event leaves, so a client that
                            # starts its next turn on seeing it is not refused as busy.
                            self._turns.release(session_id, turn)
                        yield event
                except PermissionDenied as exc:
                    # The agent could not open the session: a lesser role in its tenant, audited
                    # as the gateway's own check of it was (another tenant's, memory audits).
                    self._authz.audit.record("call.refused", "refused", caller.principal, method="gateway.Chat",
                                             session_id=session_id, reason=exc.message)
                    raise
                finally:
                    self.live.end(session_id, feed)
                log.info("turn ended")
        except BaseException as exc:
            failure = exc
            raise
        finally:
            admitted.release()
            self._turns.release(session_id, turn)
            self.runs.end(run_record, failure)

    async def attach(self, session_id: str, after_seq: int, caller: Caller = ANYONE) -> AsyncIterator[common_pb2.Event]:
        """The session's running turn, for a caller who may see the session (AttachTurn)."""
        await self._authz.session(caller, session_id, "AttachTurn")
        async for event in self.live.attach(session_id, after_seq):
            yield event

    async def list_models(self, namespace: str = "", caller: Caller = ANYONE) -> gateway_pb2.ListModelsResponse:
        """The deployment's models, then (with `namespace`) that namespace's own."""
        listed = self._deployment_models()
        if namespace:
            settings = await self._policies.namespace_settings(self._authz.namespace(caller, namespace, "ListModels"))
            listed.models.extend(gateway_pb2.ModelInfo(
                name=m.name, provider=m.provider, model=m.model, context_window=m.context_window,
                input_price_per_mtok=m.input_price_per_mtok, output_price_per_mtok=m.output_price_per_mtok,
                max_output_tokens=m.max_output_tokens, fallback=m.fallback, no_vision=m.no_vision,
                roles=["chat"], namespace=settings.namespace) for m in settings.models)
        return listed

    async def _check_turn_model(self, request: gateway_pb2.ChatRequest, existing: sessions_pb2.Session | None,
                                namespace: str, caller: Caller) -> None:
        """A turn's model that is not the deployment's must be one of its session's namespace
        (`namespace` for a new session): UNKNOWN_MODEL before anything is written."""
        model = request.options.model
        default = self._models.get(DEFAULT_MODEL)
        if not model or self._models.get(model) is not None or (default is not None and model == default.model):
            return
        if existing is None:
            existing = await self._authz.session_or_none(caller, request.session_id, "Chat")
        settings = await self._policies.namespace_settings(existing.namespace if existing is not None else namespace)
        if not any(m.name == model for m in settings.models):
            message = self._models.unknown_model_message(model)
            if settings.models:
                known = [*self._models.names(), *(m.name for m in settings.models)]
                message = (f"options.model {model[:80]!r} is not a model this deployment or namespace "
                           f"{settings.namespace!r} offers; known models: {', '.join(known)}")
            raise InvalidArgument(message, field="options.model", reason=error_reasons.UNKNOWN_MODEL,
                                  metadata={"model": model[:80]})

    def _deployment_models(self) -> gateway_pb2.ListModelsResponse:
        catalog = self._models
        return gateway_pb2.ListModelsResponse(models=[
            gateway_pb2.ModelInfo(
                name=spec.name, provider=spec.provider, model=spec.model, context_window=spec.context_window,
                input_price_per_mtok=spec.input_price_per_mtok, output_price_per_mtok=spec.output_price_per_mtok,
                max_output_tokens=spec.max_output_tokens, fallback=spec.fallback, is_default=spec.name == DEFAULT_MODEL,
                no_vision=not spec.vision, roles=catalog.roles(spec.name),
            )
            for spec in (catalog.get(name) for name in catalog.names()) if spec is not None
        ])

    def has_active_turn(self, session_id: str) -> bool:
        """Whether this replica runs a turn of `session_id` now (routing serves such calls here)."""
        return session_id in self._turns

    async def cancel(self, session_id: str, caller: Caller = ANYONE) -> tuple[bool, str]:
        validate_id(session_id)
        # A turn may run before its session is stored: no session is "nothing to cancel" — but
        # only where tenants are not configured; otherwise another tenant's running turn could be hit.
        if not caller.scope.unrestricted and await self._authz.session_or_none(caller, session_id, "Cancel") is None:
            return False, ""
        turn = self._turns.get(session_id)
        if turn is None:
            return False, ""
        turn.cancel()
        return True, turn.run_id

    def cancel_run(self, session_id: str, run_id: str) -> bool:
        """Cancel the session's running turn if it is run `run_id` (CancelRun; the caller was checked)."""
        turn = self._turns.get(session_id)
        if turn is None or turn.run_id != run_id:
            return False
        turn.cancel()
        return True

    async def approve(self, request: gateway_pb2.ApproveRequest, caller: Caller = ANYONE) -> str:
        """Pass a person's decision on a held tool call to the agent running the turn; the run id."""
        session_id = validate_id(request.session_id)
        if not request.call_id:
            raise InvalidArgument("call_id is required: the call_id of the approval_request event", field="call_id")
        if len(request.call_id) > MAX_CALL_ID_CHARS:
            raise InvalidArgument(f"call_id is longer than {MAX_CALL_ID_CHARS} characters", field="call_id")
        if len(request.note) > MAX_NOTE_CHARS:
            raise InvalidArgument(f"note is {len(request.note)} characters; the limit is {MAX_NOTE_CHARS}", field="note")
        if request.rest_of_turn and not request.approved:
            raise InvalidArgument("rest_of_turn goes with an approval: approve the call, or deny it on its own",
                                  field="rest_of_turn")
        if request.arguments_json and not request.approved:
            raise InvalidArgument("arguments_json goes with an approval: a denied call does not run",
                                  field="arguments_json")
        if len(request.arguments_json) > MAX_EDITED_ARGUMENTS_CHARS:
            raise InvalidArgument(f"arguments_json is {len(request.arguments_json)} characters; the limit is "
                                  f"{MAX_EDITED_ARGUMENTS_CHARS}", field="arguments_json")
        session = None if caller.scope.unrestricted else await self._authz.session_or_none(caller, session_id, "Approve")
        turn = self._turns.get(session_id) if session is not None or caller.scope.unrestricted else None
        if (turn is not None and session is not None and turn.started_by and turn.started_by != caller.subject
                and caller.scope.role_in(session.namespace or "default") != "admin"):
            self._authz.audit.record("approval.decided", "refused", caller.principal, session_id=session_id,
                                     call_id=request.call_id, reason="not the run's own")
            raise PermissionDenied(
                f"this run was started by {turn.started_by}; a member decides the approvals of their own runs, "
                "an admin of the tenant any",
                reason=error_reasons.NOT_RUN_OWNER, metadata={"session_id": session_id},
            )
        held = turn.pending_approvals.get(request.call_id) if turn is not None else None
        if held is not None and request.arguments_json:
            # Checked while the call is still held: refused arguments change nothing.
            await self._policies.check_arguments(turn.namespace if turn is not None else "", held.name,
                                                 request.arguments_json)
        if turn is None or turn.pending_approvals.pop(request.call_id, None) is None:
            raise NotFound(
                f"session {session_id!r} has no tool call {request.call_id!r} waiting for approval "
                "(it may have been decided already, timed out, or the turn ended)",
                reason=error_reasons.APPROVAL_NOT_FOUND, metadata={"session_id": session_id, "call_id": request.call_id},
            )
        turn.controls.put_nowait(agent_service_pb2.RunTurnRequest(decision=common_pb2.ApprovalDecision(
            call_id=request.call_id, approved=request.approved, note=request.note, rest_of_turn=request.rest_of_turn,
            arguments_json=request.arguments_json)))
        log.info("approval decided", session_id=session_id, call_id=request.call_id, approved=request.approved,
                 edited=bool(request.arguments_json))
        self._authz.audit.record("approval.decided", "allowed", caller.principal, session_id=session_id,
                                 call_id=request.call_id, approved=request.approved,
                                 edited_arguments=bool(request.arguments_json))
        return turn.run_id

    async def pending_approvals(self, session_id: str, caller: Caller = ANYONE) -> gateway_pb2.ListApprovalsResponse:
        validate_id(session_id)
        if (not caller.scope.unrestricted
                and await self._authz.session_or_none(caller, session_id, "ListApprovals") is None):
            return gateway_pb2.ListApprovalsResponse()
        turn = self._turns.get(session_id)
        if turn is None:
            return gateway_pb2.ListApprovalsResponse()
        return gateway_pb2.ListApprovalsResponse(run_id=turn.run_id, approvals=list(turn.pending_approvals.values()))

    async def drain(self, grace_s: float) -> None:
        """On shutdown: refuse new turns, let running ones finish, and shortly before the grace
        period ends tell the ones still running why their stream stops."""
        self._draining = True
        deadline = asyncio.get_running_loop().time() + max(0.0, grace_s - min(1.0, grace_s * 0.2))
        while self._turns and asyncio.get_running_loop().time() < deadline:  # noqa: ASYNC110 - turns end on many paths; a 50 ms poll bounds the drain
            await asyncio.sleep(0.05)
        for turn in self._turns.all():
            turn.cancel(interrupted=True)

    def _new_session(self, session_id: str, title: str, labels: dict[str, str], namespace: str) -> sessions_pb2.Session:
        if len(title) > self._settings.max_title_chars:
            raise InvalidArgument(f"title is longer than {self._settings.max_title_chars} characters", field="title")
        if len(labels) > self._settings.max_labels:
            raise InvalidArgument(f"at most {self._settings.max_labels} labels per session", field="labels")
        for key, value in labels.items():
            if not key or len(key) > 63 or len(value) > 256:
                raise InvalidArgument(f"label {key[:63]!r}: keys are 1-63 characters, values at most 256", field="labels")
        if namespace:
            validate_namespace(namespace)
        now = time.time()
        return sessions_pb2.Session(
            session_id=session_id,
            title=title,
            labels=labels,
            namespace=namespace or "default",
            created_at=now,
            updated_at=now,
        )
