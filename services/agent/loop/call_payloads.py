"""Each model call's request and response, recorded for the dev panel when the deployment turns
it on (AGENTMESH_AGENT_RECORD_MODEL_CALLS) or the session does (Session.record_model_calls, set
with UpdateSession); off by default (docs/api.md "Model calls").

`traced_model_call` (model_call.py) hands the request and the reply to the turn's `CallRecorder`
once the reply is complete — after the call, never in its way — and the record is written
without waiting, as usage records are: the turn waits for the writes in flight only before it
ends (`UsageTag.flush`). With recording off the turn's usage tag has no recorder (turn_start.py
decides once the session is open) and nothing is built.

What is recorded is what the loop sent and got, never the HTTP exchange: no header (the key
and any Authorization travel only there) is ever in it. Its text is masked once more as logs
are (agentmesh.logs.Redactor): every configured secret (model keys, tokens) wherever it appears,
credential-shaped strings, and any field named like a credential. Each side is cut at
`max_chars`, and a cut side says so (`"truncated": true`, with its full length).
"""

from __future__ import annotations

import asyncio
import functools
import json
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Protocol

from agentmesh.agent.types import ChatMessage, ModelReply, ModelRequest
from agentmesh.errors import AgentmeshError
from agentmesh.logs import Redactor, get_logger

if TYPE_CHECKING:
    from agentmesh.agent.loop.usage_log import UsageTag

__all__ = ["CallRecorder", "ModelCallLog", "RecordedCall", "bounded"]

log = get_logger("agentmesh.agent")


@dataclass(frozen=True)
class RecordedCall:
    id: str
    session_id: str
    run_id: str
    at: float
    model: str
    provider: str
    request_json: str
    response_json: str
    truncated: bool
    purpose: str


class ModelCallLog(Protocol):
    def record(self, call: RecordedCall) -> "asyncio.Future[None]":
        """Start storing one call's record, without waiting (as UsageLog.record)."""
        ...


def _message(m: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [{"id": c.call_id, "name": c.name, "arguments": c.arguments_json} for c in m.tool_calls]
    if m.tool_call_id:
        out["tool_call_id"], out["name"] = m.tool_call_id, m.name
    if m.images:
        out["images"] = len(m.images)  # by reference in the transcript; their bytes are not recorded
    return out


def bounded(side: dict[str, Any], max_chars: int) -> tuple[str, bool]:
    """`side` as JSON, or — longer than `max_chars` — its first `max_chars` characters as a
    string under "head", marked truncated with the full length."""
    text = json.dumps(side, ensure_ascii=False)
    if len(text) <= max_chars:
        return text, False
    return json.dumps({"truncated": True, "chars": len(text), "head": text[:max_chars]}, ensure_ascii=False), True


class CallRecorder:
    """The turn's recorder (None on the turn when recording is off)."""

    def __init__(self, calls: ModelCallLog, secrets_to_mask: Iterable[str], max_chars: int):
        self._calls = calls
        self._redactor = Redactor(secrets_to_mask)
        self._max_chars = max_chars

    def mask_also(self, secret: str) -> None:
        """Mask `secret` in what is recorded from now on (a namespace model's key, read at run time)."""
        self._redactor.add(secret)

    def record(self, tag: "UsageTag", request: ModelRequest, reply: ModelReply) -> None:
        parameters: dict[str, Any] = {"allow_tools": request.allow_tools}
        if request.max_tokens:
            parameters["max_tokens"] = request.max_tokens
        if request.temperature is not None:
            parameters["temperature"] = request.temperature
        if request.top_p is not None:
            parameters["top_p"] = request.top_p
        sent = {
            "model": request.model,
            "messages": [_message(m) for m in request.messages],
            "tools": [{"name": t.name, "description": t.description, "parameters": t.parameters} for t in request.tools],
            "parameters": parameters,
        }
        got: dict[str, Any] = {
            "text": reply.text,
            "tool_calls": [{"id": c.call_id, "name": c.name, "arguments": c.arguments_json} for c in reply.tool_calls],
            "finish_reason": reply.finish_reason,
            "model": reply.model,
            "usage": {"input_tokens": reply.usage.input_tokens, "output_tokens": reply.usage.output_tokens,
                      "cached_input_tokens": reply.usage.cached_input_tokens},
        }
        if reply.reasoning:
            got["reasoning"] = reply.reasoning
        request_json, cut_request = bounded(self._redactor.mask(sent), self._max_chars)
        response_json, cut_response = bounded(self._redactor.mask(got), self._max_chars)
        call = RecordedCall(
            id=f"{tag.run_id}.{secrets.token_hex(6)}", session_id=tag.session_id, run_id=tag.run_id, at=time.time(),
            model=request.model, provider=tag.provider, request_json=request_json, response_json=response_json,
            truncated=cut_request or cut_response, purpose=tag.purpose,
        )
        stored = self._calls.record(call)
        tag.pending.add(stored)
        stored.add_done_callback(functools.partial(_settled, tag, call))


def _settled(tag: "UsageTag", call: RecordedCall, stored: "asyncio.Future[None]") -> None:
    tag.pending.discard(stored)
    error = None if stored.cancelled() else stored.exception()
    if isinstance(error, (AgentmeshError, TimeoutError)):
        reason = error.message if isinstance(error, AgentmeshError) else "it took too long"
        log.warning("model call payloads not recorded", error=reason, model=call.model)
    elif error is not None:
        log.error("model call payloads not recorded", error=f"{type(error).__name__}: {error}", model=call.model)
