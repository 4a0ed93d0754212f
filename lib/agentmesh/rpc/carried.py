"""Unary calls carried as messages on one long-lived bidirectional stream.

Why: on grpc.aio a unary call between two processes costs ~0.46 ms of CPU (caller and server
together) and ~0.40 ms of latency on this project's 2-core machine; a message each way on a
stream that is already open, 0.16 ms and 0.15 ms (`python -m benches.carried_call`). The
calls on a turn's critical path that come several times a turn — the transcript appends, one
per step — ride one stream per caller process instead (`Memory.AppendStream`).

A carried call is still a call in everything but its transport:
- it carries its own signed service token, checked by the server exactly as a call's
  metadata is (`ServerCalls.carried`: the same caller check, the same principal and tenant
  scope for its handler);
- it has its own CLIENT and SERVER span, named and attributed as the unary method's, so a
  trace reads the same; its own `rpc.server.duration`; and its own status: a refusal or a
  core error comes back as the gRPC code and message the unary call would have had, raised at
  the caller as `grpc.aio.AioRpcError`, so `peer_call` and retries treat both alike;
- the stream is opened lazily and opened again after it breaks; calls in flight when it
  breaks fail with UNAVAILABLE (the unary call's failure when its peer goes away);
- requests larger than `CARRY_LIMIT_BYTES` go as unary calls: one stream's flow control would
  make every other call wait behind a large one.

What it does not carry: a deadline to the server (the caller stops waiting at its timeout;
the server finishes the call) and cancellation (likewise) — fine for short, idempotent-on-
retry writes such as appends, which is why only those are carried.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
from typing import Any, AsyncIterator, Awaitable, Callable, Generic, TypeVar

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace

from agentmesh.logs import get_logger
from agentmesh.rpc.auth import SERVICE_TOKEN_HEADER, current_principal
from agentmesh.rpc.calls import ServerCalls
from agentmesh.rpc.identity import ServiceIdentity
from agentmesh.telemetry.rpcspans import end_client_span, rpc_attributes, start_carried_client_span
from agentmesh.v1 import common_pb2

__all__ = ["CARRY_LIMIT_BYTES", "CarriedCalls", "CarriedClient", "NotCarried"]

log = get_logger("agentmesh.rpc")

# Above this a request goes as a unary call of its own (see the module's docstring).
CARRY_LIMIT_BYTES = 256 * 1024

Request = TypeVar("Request")
Response = TypeVar("Response")


class NotCarried(Exception):
    """The server has no such stream (an older version), or the request is too large to carry:
    make the unary call instead."""


def _rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


class CarriedClient(Generic[Request, Response]):
    """The caller's side: `await call(request, timeout)` as a unary call of `full_method`.

    `open_stream()` opens the stream (e.g. `stub.AppendStream`) on a channel that signs the
    stream itself; `wrap(header, request)` makes the stream's request message and
    `unwrap(message)` splits an answer into its CarriedStatus and response."""

    def __init__(self, full_method: str, open_stream: Callable[[], Any], *,
                 wrap: Callable[[common_pb2.CarriedCall, Request], Any],
                 unwrap: Callable[[Any], tuple[common_pb2.CarriedStatus, Response]],
                 identity: ServiceIdentity | None, audience: str, tracer: trace.Tracer | None, peer: str):
        self._method = full_method
        self._open_stream = open_stream
        self._wrap = wrap
        self._unwrap = unwrap
        self._identity = identity
        self._audience = audience
        self._tracer = tracer
        self._peer = peer
        self._attributes = rpc_attributes(full_method)
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[tuple[common_pb2.CarriedStatus, Response]]] = {}
        self._stream: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._writing = asyncio.Lock()
        self.unsupported = False  # the server answered UNIMPLEMENTED: unary calls from now on

    async def call(self, request: Request, timeout: float) -> Response:
        if self.unsupported:
            raise NotCarried(f"{self._peer} does not serve {self._method} on a stream")
        if request.ByteSize() > CARRY_LIMIT_BYTES:  # type: ignore[attr-defined]  # a protobuf message
            raise NotCarried("too large to carry")
        span, carrier = (None, {}) if self._tracer is None else start_carried_client_span(
            self._tracer, self._method, self._attributes)
        header = common_pb2.CarriedCall(
            id=next(self._ids),
            service_token=self._identity.token(self._audience, current_principal.get()) if self._identity else "",
            traceparent=carrier.get("traceparent", ""),
            tracestate=carrier.get("tracestate", ""),
        )
        answer: asyncio.Future[tuple[common_pb2.CarriedStatus, Response]] = asyncio.get_running_loop().create_future()
        self._pending[header.id] = answer
        code, details = grpc.StatusCode.CANCELLED, "the caller stopped waiting"
        try:
            try:
                async with asyncio.timeout(timeout):
                    stream = self._open()
                    async with self._writing:
                        try:
                            await stream.write(self._wrap(header, request))
                        except grpc.aio.AioRpcError as exc:  # the stream had ended: as its reader says
                            self._broken()
                            raise self._stream_failure(exc) from None
                        except (asyncio.InvalidStateError, grpc.aio.UsageError):  # ended, status unread yet
                            self._broken()
                            raise _rpc_error(grpc.StatusCode.UNAVAILABLE, f"the stream to {self._peer} ended") from None
                    status, response = await answer
            except TimeoutError:
                code, details = grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"
                raise _rpc_error(code, details) from None
            code, details = _CODES.get(status.code, grpc.StatusCode.UNKNOWN), status.message
            if code != grpc.StatusCode.OK:
                raise _rpc_error(code, details)
            return response
        except NotCarried:
            code, details = grpc.StatusCode.UNIMPLEMENTED, "not carried"
            raise
        except grpc.aio.AioRpcError as exc:
            code, details = exc.code(), exc.details() or ""
            raise
        finally:
            self._pending.pop(header.id, None)
            if span is not None:
                end_client_span(span, code, details)

    def _open(self) -> Any:
        if self._stream is None:
            # The stream outlives the turn that opens it: it runs for no principal and in no
            # trace (each carried call has its own); its reader task inherits both.
            principal = current_principal.set(None)
            detached = otel_context.attach(trace.set_span_in_context(trace.INVALID_SPAN))
            try:
                self._stream = stream = self._open_stream()
                self._reader = asyncio.get_running_loop().create_task(self._read(stream))
            finally:
                otel_context.detach(detached)
                current_principal.reset(principal)
        return self._stream

    async def _read(self, stream: Any) -> None:
        failure: BaseException = _rpc_error(grpc.StatusCode.UNAVAILABLE, f"the stream to {self._peer} ended")
        try:
            async for message in stream:
                status, response = self._unwrap(message)
                answer = self._pending.get(status.id)
                if answer is not None and not answer.done():
                    answer.set_result((status, response))
        except grpc.aio.AioRpcError as exc:
            failure = self._stream_failure(exc)
            log.info("carried calls' stream ended", method=self._method, peer=self._peer,
                     code=exc.code().name, pending=len(self._pending))
        except asyncio.CancelledError:
            pass
        finally:
            if self._stream is stream:
                self._broken()
            for answer in list(self._pending.values()):
                if not answer.done():
                    answer.set_exception(failure)

    def _stream_failure(self, exc: grpc.aio.AioRpcError) -> BaseException:
        """What the calls on a stream that ended with `exc` fail with: NotCarried when the
        server has no such stream (older), the stream's refusal as it is (UNAUTHENTICATED,
        PERMISSION_DENIED: the caller's calls would be refused too), else UNAVAILABLE — the
        peer went away, as a unary call would have found."""
        code = exc.code()
        if code == grpc.StatusCode.UNIMPLEMENTED:
            self.unsupported = True
            return NotCarried(exc.details() or "")
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            return exc
        return _rpc_error(grpc.StatusCode.UNAVAILABLE, f"the stream to {self._peer} ended: {exc.details() or code.name}")

    def _broken(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.cancel()

    async def close(self) -> None:
        stream, reader = self._stream, self._reader
        self._stream = self._reader = None
        if stream is not None:
            stream.cancel()
        if reader is not None:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)


_CODES = {code.value[0]: code for code in grpc.StatusCode}


class CarriedCalls(Generic[Request, Response]):
    """The server's side: serves a stream of carried `full_method` calls with `handle`, each as
    `ServerCalls.carried` serves a call, concurrently (in a task each), answering each as it
    finishes. `unwrap(message)` splits a stream message into its CarriedCall and request;
    `wrap(status, response)` makes the answer."""

    def __init__(self, calls: ServerCalls, full_method: str, handle: Callable[[Request], Awaitable[Response]], *,
                 unwrap: Callable[[Any], tuple[common_pb2.CarriedCall, Request]],
                 wrap: Callable[[common_pb2.CarriedStatus, Response | None], Any]):
        self._calls = calls
        self._method = full_method
        self._handle = handle
        self._unwrap = unwrap
        self._wrap = wrap
        # Each open stream's answer queue and calls in flight, for close().
        self._streams: dict[asyncio.Queue[Any], set[asyncio.Task[None]]] = {}

    async def close(self, grace_s: float = 0.0) -> None:
        """End every open stream once its calls in flight are answered (a draining service):
        callers open their next stream to a replica that serves."""
        for answers, running in list(self._streams.items()):
            if running:
                await asyncio.wait(set(running), timeout=grace_s or None)
            answers.put_nowait(None)

    async def serve(self, requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        answers: asyncio.Queue[Any] = asyncio.Queue()
        running: set[asyncio.Task[None]] = set()
        self._streams[answers] = running

        async def one(header: common_pb2.CarriedCall, request: Request) -> None:
            metadata = [(SERVICE_TOKEN_HEADER, header.service_token)] if header.service_token else []
            if header.traceparent:
                metadata.append(("traceparent", header.traceparent))
                if header.tracestate:
                    metadata.append(("tracestate", header.tracestate))
            code, details, response = await self._calls.carried(self._method, tuple(metadata), request, self._handle)
            answers.put_nowait(self._wrap(common_pb2.CarriedStatus(id=header.id, code=code.value[0], message=details),
                                          response))

        async def read() -> None:
            try:
                async for message in requests:
                    header, request = self._unwrap(message)
                    # A context of its own: the call's principal and span stay with it.
                    task = asyncio.get_running_loop().create_task(one(header, request), context=contextvars.copy_context())
                    running.add(task)
                    task.add_done_callback(running.discard)
                if running:
                    await asyncio.wait(set(running))
            finally:
                answers.put_nowait(None)

        reader = asyncio.get_running_loop().create_task(read())
        try:
            while (answer := await answers.get()) is not None:
                yield answer
            await reader  # a read error ends the stream with its status
        finally:
            self._streams.pop(answers, None)
            reader.cancel()
            for task in list(running):
                task.cancel()
