# ruff: noqa: N802 - gRPC method names, as in services/*/server.py
"""The memory service's model-call RPCs (model_calls.py) as a part of MemoryServicer (server.py):
each record is checked against the caller's tenants through its session, as transcripts are."""

from __future__ import annotations

from agentmesh.errors import InvalidArgument
from agentmesh.internal.v1 import memory_service_pb2
from agentmesh.memory.model_calls import ModelCallRecord, ModelCalls
from agentmesh.memory.tenancy import TenantGuard
from agentmesh.rpc.errors import translate_errors
from agentmesh.v1 import sessions_pb2

__all__ = ["ModelCallRpcs", "carried_calls"]


def _records(calls) -> list[ModelCallRecord]:
    return [ModelCallRecord(c.id, c.session_id, c.run_id, c.at, c.model, c.provider, c.request_json, c.response_json,
                            c.truncated, c.purpose or "turn") for c in calls]


def carried_calls(session_id: str, calls) -> list[ModelCallRecord]:
    """The calls an append carries: its session's only (the append is what was checked)."""
    if any(c.session_id != session_id for c in calls):
        raise InvalidArgument("model calls carried by an append must be of its session")
    return _records(calls)


class ModelCallRpcs:
    """Mixed into MemoryServicer, which sets these."""

    _tenants: TenantGuard
    _model_calls: ModelCalls

    @translate_errors
    async def RecordModelCalls(self, request, context):
        for session_id in {c.session_id for c in request.calls}:
            await self._tenants.session_if_any(session_id, "RecordModelCalls")
        return memory_service_pb2.RecordModelCallsResponse(recorded=await self._model_calls.record(_records(request.calls)))

    @translate_errors
    async def ListModelCalls(self, request, context):
        await self._tenants.session_if_any(request.session_id, "ListModelCalls")
        return sessions_pb2.ListModelCallsResponse(calls=[
            sessions_pb2.ModelCall(id=r.id, session_id=r.session_id, run_id=r.run_id, at=r.at, model=r.model,
                                   provider=r.provider, request_json=r.request_json, response_json=r.response_json,
                                   truncated=r.truncated, purpose=r.purpose)
            for r in await self._model_calls.list(request.session_id, request.run_id)])
