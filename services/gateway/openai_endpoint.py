"""An OpenAI-compatible API on the gateway's HTTP address, whose "models" are a namespace's named
agents (docs/agents.md, "OpenAI-compatible endpoint"), so any OpenAI client can talk to them:

    client = openai.OpenAI(base_url="http://127.0.0.1:8080/openai/<namespace>/v1", api_key=<user token>)
    client.models.list()                                   # the namespace's agents, built-ins too
    client.chat.completions.create(model="reviewer", messages=[...], stream=True)

Under `/openai/<namespace>/v1` because the gateway's own API already answers `GET /v1/models`
(ListModels: the model catalogue), and so the base URL says which namespace's agents are meant.

A completion is one turn of the agent named by `model` ("NAME" or "NAME@VERSION"), run through the
gateway's own gRPC API over loopback with the caller's `Authorization` header (loopback.py): the
same authentication, tenancy, policy and quotas as any other client. The turn's input is the last
`user` message; the conversation lives in an agentmesh session, chosen by the
`X-Agentmesh-Session` header, else derived from the `user` field (one session per namespace, user
and agent), else new for this request (the answer's `agentmesh.session_id` says which).

The agent's own tool calls run inside the turn: they reach the client as progress, never as
`tool_calls` for it to execute — in a stream, chunks with an empty `delta` and a vendor field
`agentmesh` ({"event": "tool_call", "name": ...}); without a stream, the answer's
`agentmesh.progress` list.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any, AsyncIterator

from aiohttp import web

from agentmesh.errors import AgentmeshError, InvalidArgument
from agentmesh.gateway.http.errors import error_of, error_response, json_error
from agentmesh.gateway.http.loopback import CallerRefused, GatewayCalls
from agentmesh.gateway.http.server import SECURITY_HEADERS
from agentmesh.ids import new_id, validate_id, validate_namespace
from agentmesh.v1 import common_pb2, gateway_pb2

__all__ = ["OPENAI_PREFIX", "SESSION_HEADER", "OpenAiEndpoint", "session_for"]

OPENAI_PREFIX = "/openai/{namespace}/v1"
SESSION_HEADER = "X-Agentmesh-Session"
MAX_MESSAGE_CHARS = 100_000
# How a turn's stop reason reads as an OpenAI finish_reason.
FINISH = {"completed": "stop", "max_iterations": "length", "budget": "length"}


def session_for(namespace: str, user: str, model: str) -> str:
    """The session a `user` field maps to: stable for one namespace, user and agent."""
    digest = hashlib.sha256(f"{namespace}\0{user}\0{model}".encode()).hexdigest()[:24]
    return f"oai-{digest}"


def _last_user_text(messages: Any) -> str:
    if not isinstance(messages, list) or not messages:
        raise InvalidArgument("messages must be a non-empty list", field="messages")
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):  # content parts: the text ones, in order
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
            if not isinstance(content, str) or not content.strip():
                break
            if len(content) > MAX_MESSAGE_CHARS:
                raise InvalidArgument(f"the user message is longer than {MAX_MESSAGE_CHARS} characters",
                                      field="messages")
            return content
    raise InvalidArgument("messages has no user message with text: the turn's input is the last user message",
                          field="messages")


def _error_response(exc: Exception) -> web.Response:
    if isinstance(exc, CallerRefused):
        response = error_response(exc.code, exc.message)
        response.headers["WWW-Authenticate"] = "Bearer"
        return response
    assert isinstance(exc, AgentmeshError)
    return json_error(error_of(exc))


class OpenAiEndpoint:
    def __init__(self) -> None:
        self._calls: GatewayCalls | None = None

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get(OPENAI_PREFIX + "/models", self._models)
        app.router.add_post(OPENAI_PREFIX + "/chat/completions", self._completions)

    async def start(self, calls: GatewayCalls) -> None:
        self._calls = calls

    async def stop(self) -> None:
        return None

    @property
    def calls(self) -> GatewayCalls:
        if self._calls is None:
            raise RuntimeError("the OpenAI-compatible endpoint is not started")
        return self._calls

    async def _models(self, request: web.Request) -> web.Response:
        authorization = request.headers.get("Authorization")
        try:
            namespace = validate_namespace(request.match_info["namespace"])
            agents = await self.calls.list_agents(namespace, authorization)
        except (CallerRefused, AgentmeshError) as exc:
            return _error_response(exc)
        data = [{"id": a.spec.name, "object": "model", "created": int(a.created_at), "owned_by": namespace,
                 "description": a.spec.description, "version": a.current_version, "builtin": a.builtin}
                for a in agents]
        return web.json_response({"object": "list", "data": data}, headers=SECURITY_HEADERS)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        authorization = request.headers.get("Authorization")
        try:
            namespace = validate_namespace(request.match_info["namespace"])
            try:
                body = await request.json()
            except ValueError:
                raise InvalidArgument("the body is not JSON", field="body") from None
            if not isinstance(body, dict):
                raise InvalidArgument("the body must be a JSON object", field="body")
            model = body.get("model")
            if not isinstance(model, str) or not model:
                raise InvalidArgument("model must name an agent of the namespace (GET .../models)", field="model")
            message = _last_user_text(body.get("messages"))
            stream = bool(body.get("stream", False))
            # The agent first: an unknown one (or another tenant's) is a 404 before anything runs.
            agent = await self.calls.get_agent(namespace, model, authorization)
            session_id = self._session(request, body, namespace, model)
            await self.calls.open_session(session_id, namespace, f"OpenAI chat with {agent.spec.name}", authorization,
                                          labels={"via": "openai"})
            events = self.calls.chat(session_id, message, authorization, gateway_pb2.ChatOptions(agent=model))
            # The first event before any header: a refusal (quota, busy session) is a plain HTTP error.
            first = await anext(events)
        except (CallerRefused, AgentmeshError) as exc:
            return _error_response(exc)
        except StopAsyncIteration:
            return error_response("INTERNAL", "the turn ended before it started")
        completion = _Completion(model, session_id)
        try:
            if stream:
                return await self._stream(request, completion, first, events, body)
            return await self._whole(completion, first, events)
        finally:
            # A client that went away mid-stream ends the loopback Chat call now (the gateway then
            # treats it as any dropped Chat stream), not whenever the generator is collected.
            await events.aclose()  # type: ignore[attr-defined]  # an async generator, typed as an iterator

    def _session(self, request: web.Request, body: dict[str, Any], namespace: str, model: str) -> str:
        given = request.headers.get(SESSION_HEADER)
        if given:
            return validate_id(given, SESSION_HEADER)
        user = body.get("user")
        if isinstance(user, str) and user:
            return session_for(namespace, user, model)
        return new_id("oai")

    async def _whole(self, completion: "_Completion", first: common_pb2.Event,
                     events: AsyncIterator[common_pb2.Event]) -> web.Response:
        try:
            async for event in _chain(first, events):
                completion.see(event)
        except (CallerRefused, AgentmeshError) as exc:
            return _error_response(exc)
        if completion.failure is not None:
            return error_response(*completion.failure)
        return web.json_response(completion.whole(), headers=SECURITY_HEADERS)

    async def _stream(self, request: web.Request, completion: "_Completion", first: common_pb2.Event,
                      events: AsyncIterator[common_pb2.Event], body: dict[str, Any]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                               SESSION_HEADER: completion.session_id, **SECURITY_HEADERS})
        await response.prepare(request)

        async def send(chunk: dict[str, Any] | str) -> None:
            data = chunk if isinstance(chunk, str) else json.dumps(chunk)
            await response.write(f"data: {data}\n\n".encode())

        await send(completion.chunk({"role": "assistant", "content": ""}))
        try:
            async for event in _chain(first, events):
                for chunk in completion.see(event):
                    await send(chunk)
        except (CallerRefused, AgentmeshError) as exc:
            # Headers are gone: the error travels as an event of the stream, as OpenAI's own do.
            await send({"error": error_of(exc)["error"]})
        else:
            if completion.failure is not None:
                await send({"error": {"code": completion.failure[0], "message": completion.failure[1]}})
            else:
                await send(completion.chunk({}, finish=completion.finish_reason))
                options = body.get("stream_options")
                if isinstance(options, dict) and options.get("include_usage"):
                    await send({**completion.chunk({}), "choices": [], "usage": completion.usage})
        await send("[DONE]")
        await response.write_eof()
        return response


async def _chain(first: common_pb2.Event, rest: AsyncIterator[common_pb2.Event]) -> AsyncIterator[common_pb2.Event]:
    yield first
    async for event in rest:
        yield event


class _Completion:
    """One completion as the turn's events build it: chunks for a stream, the whole answer else."""

    def __init__(self, model: str, session_id: str):
        self.model = model
        self.session_id = session_id
        self.id = new_id("chatcmpl")
        self.created = int(time.time())
        self.run_id = ""
        self.text = ""
        self.final = ""
        self.finish_reason = "stop"
        self.progress: list[dict[str, Any]] = []
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        self.failure: tuple[str, str] | None = None

    def chunk(self, delta: dict[str, Any], *, finish: str | None = None, vendor: dict[str, Any] | None = None,
              ) -> dict[str, Any]:
        chunk: dict[str, Any] = {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                                 "model": self.model,
                                 "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        if vendor is not None:
            chunk["agentmesh"] = vendor
        return chunk

    def see(self, event: common_pb2.Event) -> list[dict[str, Any]]:
        """The chunks this event makes (none for most)."""
        kind = event.WhichOneof("payload")
        if kind == "run_started":
            self.run_id = event.run_started.run_id
        elif kind == "text_delta":
            self.text += event.text_delta.text
            return [self.chunk({"content": event.text_delta.text})]
        elif kind == "tool_call":
            step: dict[str, Any] = {"event": "tool_call", "name": event.tool_call.name, "session_id": self.session_id}
            self.progress.append(step)
            return [self.chunk({}, vendor=step)]
        elif kind == "tool_result":
            result: dict[str, Any] = {"event": "tool_result", "name": event.tool_result.result.name,
                                      "is_error": event.tool_result.result.is_error}
            self.progress.append(result)
            return [self.chunk({}, vendor=result)]
        elif kind == "subagent":
            a = event.subagent
            sub: dict[str, Any] = {"event": "subagent", "state": a.state, "name": a.agent,
                                   "child_session_id": a.session_id}
            if a.state == "finished":
                sub |= {"stop_reason": a.stop_reason, "total_tokens": a.usage.total_tokens}
            self.progress.append(sub)
            return [self.chunk({}, vendor=sub)]
        elif kind == "run_finished":
            done = event.run_finished
            self.final = done.final_text
            self.finish_reason = FINISH.get(done.stop_reason, "stop")
            self.usage = {"prompt_tokens": done.usage.input_tokens, "completion_tokens": done.usage.output_tokens,
                          "total_tokens": done.usage.total_tokens}
        elif kind == "error":
            self.failure = (event.error.code or "INTERNAL", event.error.message)
        return []

    def whole(self) -> dict[str, Any]:
        return {
            "id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": self.final or self.text},
                         "finish_reason": self.finish_reason}],
            "usage": self.usage,
            "agentmesh": {"session_id": self.session_id, "run_id": self.run_id, "progress": self.progress},
        }
