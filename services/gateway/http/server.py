"""The gateway's HTTP server: the public API as HTTP/JSON + Server-Sent Events, its OpenAPI
document, and the web console, in the gateway process and event loop.

aiohttp rather than an ASGI server: its AppRunner/TCPSite run inside the loop grpc.aio already
runs, without taking over the loop or the process's signals (uvicorn's Server installs its own
handlers and wants to own shutdown), and it has what this needs built in — streamed responses
for SSE, static files, a request-body bound — from a long-kept project (aio-libs).

Every /v1 request is transcoded into the Gateway RPC its route names and made over a loopback
gRPC channel to this very gateway. So HTTP gets exactly what gRPC gets, with nothing written
twice: the bearer-token interceptor (auth.py), the core's validation and its sentences, session
routing between replicas, and the turn's trace (the HTTP span is the parent of the RPC's).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import AsyncGenerator
from importlib import metadata as package_metadata
from pathlib import Path
from typing import Any, AsyncIterator, Mapping, Protocol, Sequence

import grpc
from aiohttp import web
from opentelemetry import propagate, trace

from agentmesh import error_reasons
from agentmesh.clients.gateway import GatewayClient, SchedulerClient
from agentmesh.errors import AgentmeshError, InvalidArgument
from agentmesh.gateway.http.errors import error_of, error_response, json_error
from agentmesh.gateway.http.guard import BodyTooSlow, ClientLimits, HttpLimits, check_host, read_body
from agentmesh.gateway.http.loopback import GatewayCalls
from agentmesh.gateway.http.openapi import openapi_document
from agentmesh.gateway.http.routes import Route, routes_of
from agentmesh.gateway.http.sse import TurnFeeds, parse_last_event_id, sse_message, transcript_after
from agentmesh.gateway.http.transcode import build_request, to_json
from agentmesh.logs import get_logger
from agentmesh.rpc.auth import CallerCheck
from agentmesh.rpc.client import open_channel
from agentmesh.rpc.identity import Principal
from agentmesh.rpc.server import PortInUse
from agentmesh.telemetry import Telemetry
from agentmesh.v1 import common_pb2, gateway_pb2, scheduler_pb2, sessions_pb2

log = get_logger("agentmesh.gateway.http")

WEB_ROOT = Path(__file__).resolve().parent.parent / "web"
UNARY_TIMEOUT_S = 60.0
# A comment line on a quiet stream, so proxies and browsers do not give up during a long tool call.
SSE_KEEPALIVE_S = 15.0
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
CONSOLE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)


@functools.cache
def package_version() -> str:
    # Read from the installed distribution's metadata (a few ms): once per process, not at each start.
    try:
        return package_metadata.version("agentmesh")
    except package_metadata.PackageNotFoundError:
        return "0"


@functools.cache
def _api() -> tuple[tuple[Route, ...], dict[str, Any]]:
    """The routes and the OpenAPI document, from the protos' `google.api.http` options: the same
    for every gateway of a process (built once; the document is served, never changed)."""
    routes = (*routes_of(gateway_pb2.DESCRIPTOR.services_by_name["Gateway"]),
              *routes_of(scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"]))
    return routes, openapi_document(list(routes), package_version())


def _metadata(request: web.Request) -> tuple[tuple[str, str], ...]:
    """What the gRPC interceptor needs to authenticate the caller: their Authorization header."""
    value = request.headers.get("Authorization", "")
    if value and value.isascii() and value.isprintable():
        return (("authorization", value),)
    return ()


class Endpoint(Protocol):
    """More served on the same address: the A2A agents and the MCP server (their own paths)."""

    def add_routes(self, app: web.Application) -> None: ...
    async def start(self, calls: GatewayCalls) -> None: ...
    async def stop(self) -> None: ...


class HttpApi:
    def __init__(self, address: str, telemetry: Telemetry, max_body_bytes: int, scheduler_target: str,
                 endpoints: Sequence[Endpoint] = (), limits: HttpLimits | None = None,
                 callers: Mapping[str, CallerCheck] | None = None):
        self.address = address
        # Slow and greedy clients (guard.py), and who a request is from when it is refused
        # before its RPC is made (by service: the gateway's and the scheduler's caller checks).
        self.limits = limits or HttpLimits()
        self.clients = ClientLimits(self.limits)
        self._callers = dict(callers or {})
        self._listener: asyncio.AbstractServer | None = None
        # Cron jobs are the scheduler's own API (it authenticates users itself), so its routes
        # go to the scheduler, the rest to this gateway's gRPC server.
        routes, self.openapi = _api()
        self.routes: list[Route] = list(routes)
        self._scheduler_target = scheduler_target
        self.port = 0
        self._telemetry = telemetry
        self._max_body_bytes = max_body_bytes
        self._feeds = TurnFeeds()
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None  # a gateway_pb2_grpc.GatewayStub once started
        self._scheduler_channel: grpc.aio.Channel | None = None
        self._stubs: dict[str, Any] = {}  # service name -> its stub, once started
        self._runner: web.AppRunner | None = None
        self._endpoints = tuple(endpoints)

    @property
    def target(self) -> str:
        host = self.address.rpartition(":")[0].strip("[]")
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    # --- life cycle -------------------------------------------------------------------------

    def application(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware], client_max_size=self._max_body_bytes)
        for route in self.routes:
            if not route.streaming:
                handler = self._unary_handler(route)
            elif route.rpc == "Chat":
                handler = self._streaming_handler(route)
            else:
                handler = self._sse_handler(route)
            app.router.add_route(route.http_method, route.path, handler, name=route.name)
        app.router.add_get("/openapi.json", self._openapi)
        for endpoint in self._endpoints:
            endpoint.add_routes(app)
        app.router.add_get("/", self._console)
        app.router.add_static("/static/", WEB_ROOT, name="static", append_version=False)
        return app

    async def start(self, grpc_target: str) -> None:
        """Listen on `address`, calling the gateway's gRPC server at `grpc_target`."""
        self._channel = open_channel(grpc_target, self._telemetry)
        self._stub = GatewayClient(self._channel, grpc_target).stub
        self._scheduler_channel = open_channel(self._scheduler_target, self._telemetry)
        self._stubs = {"Gateway": self._stub,
                       "Scheduler": SchedulerClient(self._scheduler_channel, self._scheduler_target).stub}
        for endpoint in self._endpoints:
            await endpoint.start(GatewayCalls(self._stub))
        # keepalive_timeout: how long a connection may sit idle between requests.
        self._runner = web.AppRunner(self.application(), access_log=None, handle_signals=False, shutdown_timeout=1.0,
                                     keepalive_timeout=self.limits.idle_timeout_s)
        await self._runner.setup()
        host, _, port = self.address.rpartition(":")
        assert self._runner.server is not None
        # Listening here rather than through a TCPSite: each connection's protocol is wrapped
        # in the guard (header timeout, per-address cap) before aiohttp sees a byte.
        try:
            self._listener = await asyncio.get_running_loop().create_server(
                self.clients.factory(self._runner.server), host.strip("[]"), int(port), reuse_address=True, backlog=1024)
        except OSError as exc:
            await self._runner.cleanup()
            raise PortInUse(f"cannot listen for HTTP on {self.address}: {exc.strerror or exc}") from None
        self.port = self._listener.sockets[0].getsockname()[1]
        log.info("http api started", address=self.address, port=self.port, console=f"http://{self.target}/")

    async def stop(self) -> None:
        await self._feeds.close()
        for endpoint in self._endpoints:
            await endpoint.stop()
        if self._listener is not None:
            self._listener.close()
        if self._runner is not None:
            await self._runner.cleanup()
        for channel in (self._channel, self._scheduler_channel):
            if channel is not None:
                await channel.close()

    # --- every request ---------------------------------------------------------------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler) -> web.StreamResponse:
        try:
            return await self._answer(request, handler)
        finally:
            # Answered: the connection's next request head is timed from its first byte.
            self.clients.request_done(request.transport)

    async def _answer(self, request: web.Request, handler) -> web.StreamResponse:
        # The API and the protocol endpoints (A2A, MCP) get a server span, joining the caller's trace.
        api = request.path.startswith(("/v1/", "/a2a/", "/mcp", "/.well-known/", "/openai/"))
        try:
            check_host(request, self.address.rpartition(":")[0].strip("[]"))
            if request.body_exists:
                await read_body(request, self.limits.body_timeout_s)
        except AgentmeshError as exc:
            response = json_error(error_of(exc))
            response.headers.update(SECURITY_HEADERS)
            return response
        except BodyTooSlow as exc:
            response = error_response("DEADLINE_EXCEEDED", exc.message)
            response.set_status(408)
            response.force_close()
            return response
        except web.HTTPRequestEntityTooLarge:
            response = await self._refused_first(request) or error_response(
                "INVALID_ARGUMENT", f"the request body is larger than {self._max_body_bytes} bytes")
            response.force_close()  # the rest of the body is not read
            response.headers.update(SECURITY_HEADERS)
            return response
        if not api:
            response = await handler(request)
            response.headers.update(SECURITY_HEADERS)
            return response
        resource = request.match_info.route.resource
        template = resource.canonical if resource is not None else request.path
        with self._telemetry.tracer.start_as_current_span(
            f"{request.method} {template}",
            context=propagate.extract(request.headers),
            kind=trace.SpanKind.SERVER,
            attributes={"http.request.method": request.method, "http.route": template, "url.path": request.path},
        ) as span:
            try:
                response = await handler(request)
            except web.HTTPMethodNotAllowed as exc:
                response = error_response("UNIMPLEMENTED", f"{request.method} is not served at {request.path}; "
                                          f"use {', '.join(sorted(exc.allowed_methods))}")
                response.set_status(405)
            except web.HTTPNotFound:
                response = error_response("NOT_FOUND", f"no route {request.method} {request.path}: see /openapi.json")
            except web.HTTPRequestEntityTooLarge:
                response = error_response(
                    "INVALID_ARGUMENT", f"the request body is larger than {self._max_body_bytes} bytes",
                    error_reasons.REQUEST_TOO_LARGE, {"limit_bytes": str(self._max_body_bytes)},
                )
            except AgentmeshError as exc:
                # Refused here, before any RPC: an unauthenticated caller still hears 401 first.
                response = await self._refused_first(request) or json_error(error_of(exc))
            except grpc.aio.AioRpcError as err:
                response = json_error(error_of(err))
            except Exception as exc:
                log.exception("unhandled error in an HTTP handler", route=template)
                trace_id = format(span.get_span_context().trace_id, "032x")
                response = error_response(
                    "INTERNAL", f"internal error ({type(exc).__name__}); the gateway log has the details; trace {trace_id}",
                    error_reasons.INTERNAL_ERROR, {"trace_id": trace_id},
                )
            span.set_attribute("http.response.status_code", response.status)
            if response.status >= 500:
                span.set_status(trace.Status(trace.StatusCode.ERROR))
            response.headers.update(SECURITY_HEADERS)
            response.headers.setdefault("Cache-Control", "no-store")
            return response

    async def _refused_first(self, request: web.Request) -> web.Response | None:
        """The caller's refusal (401/403, the RPC's own sentence), for a request refused before
        its RPC: the gRPC interceptor never saw it, and bad input must not be told to a caller
        who may not call at all. None when the caller would be let in (or the route has no RPC)."""
        route = request.match_info.route
        rpc = route.name if route is not None else None
        check = next((self._callers[r.service] for r in self.routes
                      if r.rpc == rpc and r.service in self._callers), None)
        if check is None or not request.path.startswith("/v1/"):
            return None
        service = next(r.service for r in self.routes if r.rpc == rpc)
        decision = await check.admit(f"/agentmesh.v1.{service}/{rpc}", _metadata(request))
        if isinstance(decision, Principal):
            return None
        return error_response(decision[0].name, decision[1])

    # --- unary routes ----------------------------------------------------------------------

    def _unary_handler(self, route: Route):
        async def handle(request: web.Request) -> web.Response:
            _require_json(route, request)
            message = build_request(route, request.match_info, _query(request), await request.read())
            method = getattr(self._stubs[route.service], route.rpc)
            reply = await method(message, metadata=_metadata(request), timeout=UNARY_TIMEOUT_S)
            return web.json_response(to_json(reply), dumps=_dumps)

        return handle

    # --- chat: Server-Sent Events ----------------------------------------------------------

    def _streaming_handler(self, route: Route):
        async def handle(request: web.Request) -> web.StreamResponse:
            _require_json(route, request)
            body = await request.read()
            metadata = _metadata(request)
            session_id = request.match_info["session_id"]
            last_event_id = request.headers.get("Last-Event-ID")
            # A resumed stream starts no turn: the body a retrying client sends again is not read.
            message = build_request(route, request.match_info, {}, body) if last_event_id is None else None
            # One call first: it authenticates, checks the id, and says where the transcript stands.
            base = await self._transcript_position(session_id, metadata, missing_ok=last_event_id is None)
            if message is None:
                return await self._stream(request, self._resumed(session_id, last_event_id or "", metadata))
            call = getattr(self._stub, route.rpc)(message, metadata=metadata)
            first = await call.read()  # refusals (bad input, busy session) come before any event
            if first is grpc.aio.EOF:
                return error_response("INTERNAL", "the turn ended without any event")
            feed = self._feeds.start(
                session_id,
                base,
                first,
                _remaining(call),
                end_position=lambda: self._transcript_position(session_id, metadata, missing_ok=True),
                on_failure=lambda exc: _failure_event(first, exc),
            )
            return await self._stream(request, feed.follow())

        return handle

    def _sse_handler(self, route: Route):
        """Any other stream (WatchActivity, AttachTurn): one SSE message per message, `event:` its
        payload's name, `data:` the message as JSON."""
        async def handle(request: web.Request) -> web.StreamResponse:
            _require_json(route, request)
            message = build_request(route, request.match_info, _query(request), await request.read())
            call = getattr(self._stubs[route.service], route.rpc)(message, metadata=_metadata(request))

            async def messages() -> AsyncIterator[bytes]:
                try:
                    async for item in call:
                        kind = item.WhichOneof("payload") if "payload" in item.DESCRIPTOR.oneofs_by_name else None
                        yield sse_message("", kind or "message", to_json(item))
                finally:
                    call.cancel()

            return await self._stream(request, messages())

        return handle

    async def _transcript_position(self, session_id: str, metadata, *, missing_ok: bool) -> int:
        try:
            session = await self._stub.GetSession(
                sessions_pb2.GetSessionRequest(session_id=session_id), metadata=metadata, timeout=UNARY_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as err:
            if missing_ok and err.code() == grpc.StatusCode.NOT_FOUND:
                return 0  # Chat creates the session
            raise
        return session.message_count

    async def _resumed(self, session_id: str, last_event_id: str, metadata) -> AsyncIterator[bytes]:
        position, delivered = parse_last_event_id(last_event_id)
        feed = self._feeds.get(session_id)
        if feed is not None and delivered is not None and feed.base == position:
            async for message in feed.follow(delivered):
                yield message
            return
        # A turn still running here: the transcript up to where it began, then its events.
        live = feed if feed is not None and not feed.done and feed.base >= position else None

        async def read_page(after: int) -> sessions_pb2.GetTranscriptResponse:
            request = sessions_pb2.GetTranscriptRequest(session_id=session_id, after_seq=after, page_size=1000)
            return await self._stub.GetTranscript(request, metadata=metadata, timeout=UNARY_TIMEOUT_S)

        async for message in transcript_after(read_page, position, live.base if live else None):
            yield message
        if live is not None:
            async for message in live.follow():
                yield message

    async def _stream(self, request: web.Request, messages: AsyncIterator[bytes]) -> web.StreamResponse:
        # Errors before the first byte (a bad Last-Event-ID, a refused call) still answer as JSON.
        iterator = aiter(messages)
        pending = asyncio.ensure_future(anext(iterator, None))
        done, _ = await asyncio.wait({pending}, timeout=SSE_KEEPALIVE_S)
        first = pending.result() if done else None
        response = web.StreamResponse(headers={
            "Content-Type": "text/event-stream; charset=utf-8",
            "Cache-Control": "no-store",
            "X-Accel-Buffering": "no",
        })
        await response.prepare(request)
        try:
            if done:
                if first is None:
                    return response
                await response.write(first)
                pending = asyncio.ensure_future(anext(iterator, None))
            while True:
                done, _ = await asyncio.wait({pending}, timeout=SSE_KEEPALIVE_S)
                if not done:
                    await response.write(b": keep-alive\n\n")
                    continue
                chunk = pending.result()
                if chunk is None:
                    break
                await response.write(chunk)
                pending = asyncio.ensure_future(anext(iterator, None))
        except (AgentmeshError, grpc.aio.AioRpcError) as exc:
            # Failed once the stream had started: say so the way a turn's stream ends, as an error
            # event (with the reason and metadata an error body has).
            error = error_of(exc)["error"]
            with contextlib.suppress(ConnectionResetError):
                await response.write(sse_message("", "error", {"error": {
                    key: error[key] for key in ("code", "message", "reason", "domain", "metadata")}}))
        except ConnectionResetError:
            # The client went away. A turn goes on in its feed; the client may resume it.
            pending.cancel()
            return response
        except asyncio.CancelledError:
            pending.cancel()
            raise
        finally:
            if not pending.done():
                # Closing the iterator while its next step is still running would fail ("already
                # running") and leave it open: let the cancelled step end first.
                pending.cancel()
                await asyncio.wait({pending})
            if isinstance(iterator, AsyncGenerator):  # every source here is one; a plain iterator has nothing to close
                with contextlib.suppress(Exception):
                    await iterator.aclose()
        # A client gone by now (it dropped the stream as the turn ended) has nothing left to be told.
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()
        return response

    # --- documents -------------------------------------------------------------------------

    async def _openapi(self, request: web.Request) -> web.Response:
        return web.json_response(self.openapi, dumps=_dumps)

    async def _console(self, request: web.Request) -> web.FileResponse:
        response = web.FileResponse(WEB_ROOT / "index.html")
        response.headers["Content-Security-Policy"] = CONSOLE_CSP
        response.headers["Cache-Control"] = "no-cache"
        return response


async def _remaining(call) -> AsyncIterator[common_pb2.Event]:
    while (event := await call.read()) is not grpc.aio.EOF:
        yield event


def _failure_event(first: common_pb2.Event, exc: BaseException) -> common_pb2.Event:
    if isinstance(exc, grpc.aio.AioRpcError):
        body = error_of(exc)["error"]
        error = common_pb2.RunError(code=body["code"], message=body["message"], reason=body["reason"],
                                    metadata=body["metadata"])
    else:
        error = common_pb2.RunError(code="INTERNAL", message=f"the turn's stream failed ({type(exc).__name__})",
                                    reason=error_reasons.INTERNAL_ERROR)
    return common_pb2.Event(session_id=first.session_id, run_id=first.run_id, error=error)


def _require_json(route: Route, request: web.Request) -> None:
    """Routes with a body take JSON only. Besides saying what is expected, this keeps other web
    pages out: a browser sends a cross-site POST with a JSON content type only after a CORS
    preflight, which this server never grants."""
    if route.body and request.content_type != "application/json":
        raise InvalidArgument(
            f"send the body as JSON with 'Content-Type: application/json' (got {request.content_type!r}); "
            "with curl: --json '{...}'"
        )


def _query(request: web.Request) -> dict[str, list[str]]:
    return {key: request.query.getall(key) for key in request.query}


def _dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False)
