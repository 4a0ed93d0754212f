# ruff: noqa: N802 - gRPC method names, as in services/*/server.py
"""The memory service's retention, erasure and restore RPCs (retention.py; `agentmesh import`)
as a part of MemoryServicer (server.py) of their own, and who made a record: the principal a
session or memory is created for, kept on it so that erasing a person can find what is theirs."""

from __future__ import annotations

from dataclasses import replace

from agentmesh.errors import AlreadyExists, InvalidArgument, NotFound
from agentmesh.internal.v1 import memory_service_pb2
from agentmesh.memory.convert import message_from_proto, session_from_proto, session_to_proto
from agentmesh.memory.fork import fork_session
from agentmesh.memory.retention import Retention
from agentmesh.memory.tenancy import TenantGuard
from agentmesh.memory.transcripts import MAX_PAGE_MESSAGES, Transcripts
from agentmesh.rpc.auth import current_principal
from agentmesh.rpc.errors import translate_errors
from agentmesh.v1 import sessions_pb2

__all__ = ["RetentionRpcs", "creator"]

FORK_BATCH = 500  # messages a fork appends at once (under max_messages_per_append)


def creator() -> str:
    """The subject of the person the current call runs for ("user:alice"); "" for a service
    acting on its own (a scheduled run's principal is its job's creator, so it counts)."""
    principal = current_principal.get()
    if principal is None or principal.subject.startswith("service:"):
        return ""
    return principal.subject


class RetentionRpcs:
    """Mixed into MemoryServicer, which sets these."""

    _tenants: TenantGuard
    _retention: Retention
    _transcripts: Transcripts

    def _appended(self, session_id: str) -> None:
        """Marks a session for recall's index: RecallRpcs', earlier in MemoryServicer's bases."""
        raise NotImplementedError

    @translate_errors
    async def Sweep(self, request, context):
        if not request.namespace:
            # Only the namespaces' names, and only to the gateway (CALLERS), which asks for its
            # own sweep of every namespace; each namespace's pass is checked below.
            return memory_service_pb2.SweepResponse(namespaces=await self._retention.kept_namespaces())
        self._tenants.namespace(request.namespace, "Sweep")
        done = await self._retention.sweep(request.namespace, request.now, request.max_items,
                                           list(request.workspaces_removed), request.only_note)
        return memory_service_pb2.SweepResponse(memories_removed=done.memories_removed, usage_removed=done.usage_removed,
                                        expired_sessions=done.expired_sessions,
                                        expired_workspaces=done.expired_workspaces, done=done.done)

    @translate_errors
    async def EraseUser(self, request, context):
        self._tenants.namespace(request.namespace or "default", "EraseUser")
        done = await self._retention.erase_user(request.namespace, request.user, request.max_items)
        return sessions_pb2.EraseUserResponse(memories_removed=done.memories_removed, usage_removed=done.usage_removed,
                                              sessions=done.sessions, done=done.done)

    @translate_errors
    async def ForkSession(self, request, context):
        source = await self._tenants.session(request.session_id, "ForkSession")
        # The fork goes into the source's namespace, for the caller; an id another tenant uses is refused.
        await self._tenants.may_put(request.new_session_id, source.namespace)
        fork, count = await fork_session(self._transcripts, source, request.at_seq, request.new_session_id,
                                         request.title, creator(), FORK_BATCH)
        return sessions_pb2.ForkSessionResponse(session=session_to_proto(fork), messages=count)

    @translate_errors
    async def RestoreSession(self, request, context):
        session = session_from_proto(request.session)
        self._tenants.namespace(session.namespace or "default", "RestoreSession")
        if len(request.messages) > MAX_PAGE_MESSAGES:
            raise InvalidArgument(f"{len(request.messages)} messages in one restore; the limit is "
                                  f"{MAX_PAGE_MESSAGES}", field="messages")
        messages = [message_from_proto(m) for m in request.messages]
        if request.continues:
            await self._tenants.session(session.session_id, "RestoreSession")
            appended = await self._transcripts.append_messages(session.session_id, messages) if messages else 0
            self._appended(session.session_id)  # recall over conversations indexes it, off this call's path
            return memory_service_pb2.RestoreSessionResponse(messages=appended)
        # Another tenant's session of that id reads as not existing, and is refused (may_put).
        await self._tenants.may_put(session.session_id, session.namespace or "default")
        try:
            await self._tenants.session(session.session_id, "RestoreSession")
            exists = True
        except NotFound:
            exists = False
        if exists and not request.replace:
            raise AlreadyExists(f"session {session.session_id!r} exists already; import with --replace to "
                                "overwrite it", metadata={"session_id": session.session_id})
        if exists:
            await self._transcripts.delete_session(session.session_id)
        # The session as exported (its creator and creation time); its transcript appended as
        # the agent appended it, so every rule of a transcript is checked again.
        await self._transcripts.put_session(replace(session, message_count=0))
        appended = await self._transcripts.append_messages(session.session_id, messages) if messages else 0
        self._appended(session.session_id)
        return memory_service_pb2.RestoreSessionResponse(messages=appended)
