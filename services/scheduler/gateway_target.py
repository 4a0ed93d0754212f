"""Adapter: a scheduled run is one gateway `Chat` turn, exactly like a user's.

The event stream is read to its end: RunStarted gives session and trace id, RunFinished the
final text (the summary) and stop reason, RunError or a failed RPC the error.
"""

from __future__ import annotations

from typing import Awaitable, Callable

import grpc

from agentmesh.clients.gateway import GatewayClient
from agentmesh.rpc.auth import current_principal
from agentmesh.rpc.identity import Principal
from agentmesh.scheduler.model import RunOutcome, RunRequest
from agentmesh.v1 import gateway_pb2

SUMMARY_CHARS = 2000
ERROR_CHARS = 2000

OnStarted = Callable[[str, str], Awaitable[None]]


def _clip(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


class GatewayRunTarget:
    def __init__(self, gateway: GatewayClient):
        # The channel signs each call with the scheduler's service identity (agentmesh.rpc.auth).
        self._channel = gateway.channel
        self._stub = gateway.stub
        self._metadata = ()

    async def close(self) -> None:
        await self._channel.close()

    def _chat_request(self, request: RunRequest) -> gateway_pb2.ChatRequest:
        options = gateway_pb2.ChatOptions(mode=request.mode, if_busy=request.if_busy,
                                          plan=bool(request.plan), plan_auto_approve=request.plan == "auto",
                                          agent=request.agent)
        return gateway_pb2.ChatRequest(session_id=request.session_id, message=request.prompt, options=options)

    async def run(self, request: RunRequest, on_started: OnStarted) -> RunOutcome:
        # The channel signs for the current principal: the job's creator, else the scheduler.
        principal = Principal(request.principal, request.tenant) if request.principal else None
        acting = current_principal.set(principal)
        try:
            return await self._run(request, on_started)
        finally:
            current_principal.reset(acting)

    async def _run(self, request: RunRequest, on_started: OnStarted) -> RunOutcome:
        session_id, trace_id, texts = request.session_id, "", []
        call = self._stub.Chat(self._chat_request(request), metadata=self._metadata, timeout=request.timeout_s)
        try:
            async for event in call:
                kind = event.WhichOneof("payload")
                if kind == "run_started":
                    session_id = event.run_started.session_id or session_id
                    trace_id = event.run_started.trace_id or trace_id
                    await on_started(session_id, trace_id)
                elif kind == "text_delta":
                    texts.append(event.text_delta.text)
                elif kind == "run_finished":
                    done = event.run_finished
                    trace_id = done.trace_id or trace_id
                    summary = _clip(done.final_text or "".join(texts), SUMMARY_CHARS)
                    if done.stop_reason == "cancelled":
                        return RunOutcome("cancelled", session_id, trace_id, summary, "the run was cancelled")
                    if done.stop_reason and done.stop_reason != "completed":
                        summary = _clip(f"[stopped: {done.stop_reason}] {summary}", SUMMARY_CHARS)
                    return RunOutcome("succeeded", session_id, trace_id, summary)
                elif kind == "error":
                    error = f"{event.error.code or 'ERROR'}: {event.error.message}"
                    return RunOutcome("failed", session_id, trace_id, _clip("".join(texts), SUMMARY_CHARS),
                                      _clip(error, ERROR_CHARS))
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                message = f"the run took longer than {request.timeout_s:.0f}s and was stopped"
            else:
                message = f"{err.code().name}: {err.details() or 'the gateway refused the run'}"
            return RunOutcome("failed", session_id, trace_id, "", _clip(message, ERROR_CHARS))
        finally:
            call.cancel()  # a no-op after a clean end; stops the turn if we were cancelled
        return RunOutcome("failed", session_id, trace_id, _clip("".join(texts), SUMMARY_CHARS),
                          "the gateway ended the stream before the run finished")

    async def cancel(self, session_id: str) -> None:
        try:
            await self._stub.Cancel(gateway_pb2.CancelRequest(session_id=session_id), metadata=self._metadata, timeout=10)
        except grpc.aio.AioRpcError:
            pass  # the run may have ended meanwhile; the caller also cancels its own task
