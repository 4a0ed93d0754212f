"""Model calls' payloads (loop/call_payloads.py) stored by the memory service, beside the
session's transcript (services/memory/model_calls.py): carried by the session's next transcript
append when one comes at once (UsageOutbox, as usage records are), else sent alone."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from agentmesh.agent.loop.call_payloads import RecordedCall
from agentmesh.clients.memory import MemoryClient
from agentmesh.v1 import sessions_pb2

if TYPE_CHECKING:
    from agentmesh.agent.adapters.memory import UsageOutbox

__all__ = ["GrpcModelCallLog", "call_to_proto"]


def call_to_proto(call: RecordedCall) -> sessions_pb2.ModelCall:
    return sessions_pb2.ModelCall(
        id=call.id, session_id=call.session_id, run_id=call.run_id, at=call.at, model=call.model,
        provider=call.provider, request_json=call.request_json, response_json=call.response_json,
        truncated=call.truncated, purpose=call.purpose)


class GrpcModelCallLog:
    def __init__(self, client: MemoryClient, outbox: "UsageOutbox | None" = None):
        self._client = client
        self._outbox = outbox

    def record(self, call: RecordedCall) -> "asyncio.Future[None]":
        if self._outbox is not None:
            return self._outbox.hold(call, self._send_alone)
        return asyncio.ensure_future(self._send_alone(call))

    async def _send_alone(self, call: RecordedCall) -> None:
        await self._client.record_model_calls([call_to_proto(call)])
