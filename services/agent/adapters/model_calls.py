"""Model calls' payloads (loop/call_payloads.py) stored by the memory service, beside the
session's transcript (services/memory/model_calls.py)."""

from __future__ import annotations

import asyncio

from agentmesh.agent.loop.call_payloads import RecordedCall
from agentmesh.clients.memory import MemoryClient
from agentmesh.v1 import sessions_pb2

__all__ = ["GrpcModelCallLog"]


class GrpcModelCallLog:
    def __init__(self, client: MemoryClient):
        self._client = client

    def record(self, call: RecordedCall) -> "asyncio.Future[None]":
        return asyncio.ensure_future(self._send(call))

    async def _send(self, call: RecordedCall) -> None:
        await self._client.record_model_calls([sessions_pb2.ModelCall(
            id=call.id, session_id=call.session_id, run_id=call.run_id, at=call.at, model=call.model,
            provider=call.provider, request_json=call.request_json, response_json=call.response_json,
            truncated=call.truncated, purpose=call.purpose)])
