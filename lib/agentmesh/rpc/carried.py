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
from typing import Any, AsyncIterator, Awaitable, Callable, Generic, TypeVar, cast

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

_Request = TypeVar("_Request")
_Response = TypeVar("_Response")


class NotCarried(Exception):
    """The server has no such stream (an older version), or the request is too large to carry:
    make the unary call instead."""


def _rpc_error(code: grpc.StatusCode, details: str) -> BaseException:
    error: BaseException = grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)
    return error


class _OpenStream:
    """One open stream: its calls waiting for answers, and the two tasks that write its messages
    and read its answers. A caller only ever awaits its own future, so asyncio.timeout and
    cancellation act on it at once — never inside grpc.aio's call machinery, which can hold a
    cancellation while it waits for the peer."""

    def __init__(self, call: Any, unwrap: Callable[[Any], tuple[common_pb2.CarriedStatus, Any]],
                 failure_of: Callable[[BaseException], BaseException], on_end: Callable[["_OpenStream"], None]):
        self.call = call
        self._unwrap = unwrap
        self._failure_of = failure_of
        self._on_end = on_end
        self.pending: dict[int, asyncio.Future[tuple[common_pb2.CarriedStatus, Any]]] = {}
        self._outbox: asyncio.Queue[Any] = asyncio.Queue()
        self._writer = asyncio.get_running_loop().create_task(self._write())
        self._reader = asyncio.get_running_loop().create_task(self._read())
        self.ended = False

    def send(self, call_id: int, message: Any) -> asyncio.Future[tuple[common_pb2.CarriedStatus, Any]]:
        answer: asyncio.Future[tuple[common_pb2.CarriedStatus, Any]] = asyncio.get_running_loop().create_future()
        self.pending[call_id] = answer
        self._outbox.put_nowait((call_id, message))
        return answer

    async def _write(self) -> None:
        try:
            # Connected first (the channel may wait for a restarting peer): a message is written
            # only once it can go at once, so one whose caller has stopped waiting is never sent
            # late — an append the caller gave up on (and will retry) must not land after all.
            await self.call.wait_for_connection()
            while True:
                call_id, message = await self._outbox.get()
                if call_id in self.pending:
                    await self.call.write(message)
        except asyncio.CancelledError:
            pass
        except grpc.aio.AioRpcError as exc:
            self.end(exc)
        except (asyncio.InvalidStateError, grpc.aio.UsageError):
            # The stream ended before this write: fail its calls with how it ended (an older
            # server's UNIMPLEMENTED included), whichever of writer and reader sees it first.
            self.end(_rpc_error(await self.call.code(), await self.call.details() or ""))

    async def _read(self) -> None:
        try:
            async for message in self.call:
                status, response = self._unwrap(message)
                answer = self.pending.pop(status.id, None)
                if answer is not None and not answer.done():
                    answer.set_result((status, response))
            self.end(None)
        except asyncio.CancelledError:
            pass
        except grpc.aio.AioRpcError as exc:
            self.end(exc)

    def end(self, error: BaseException | None) -> None:
        """The stream is over (`error`: how it ended, None: the server ended it, e.g. draining):
        its calls waiting for answers fail as `failure_of` says; the next call opens another."""
        if self.ended:
            return
        self.ended = True
        self._on_end(self)
        failure = self._failure_of(
            error if error is not None else _rpc_error(grpc.StatusCode.UNAVAILABLE, "the stream was closed by the server"))
        for answer in self.pending.values():
            if not answer.done():
                answer.set_exception(failure)
        self.pending.clear()
        current = asyncio.current_task()
        for task in (self._writer, self._reader):
            if task is not current:
                task.cancel()
        self.call.cancel()


class CarriedClient(Generic[_Request, _Response]):
    """The caller's side: `await call(request, timeout)` as a unary call of `full_method`.

    `open_stream()` opens the stream (e.g. `stub.AppendStream`) on a channel that signs the
    stream itself; `wrap(header, request)` makes the stream's request message and
    `unwrap(message)` splits an answer into its CarriedStatus and response."""

    def __init__(self, full_method: str, open_stream: Callable[[], Any], *,
                 wrap: Callable[[common_pb2.CarriedCall, _Request], Any],
                 unwrap: Callable[[Any], tuple[common_pb2.CarriedStatus, _Response]],
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
        self._stream: _OpenStream | None = None
        self.unsupported = False  # the server answered UNIMPLEMENTED: unary calls from now on

    async def call(self, request: _Request, timeout: float) -> _Response:
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
        code, details = grpc.StatusCode.CANCELLED, "the caller stopped waiting"
        stream = self._open()
        try:
            try:
                async with asyncio.timeout(timeout):
                    status, response = await stream.send(header.id, self._wrap(header, request))
            except TimeoutError:
                code, details = grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"
                raise _rpc_error(code, details) from None
            code, details = _CODES.get(status.code, grpc.StatusCode.UNKNOWN), status.message
            if code != grpc.StatusCode.OK:
                raise _rpc_error(code, details)
            return cast(_Response, response)
        except NotCarried:
            code, details = grpc.StatusCode.UNIMPLEMENTED, "not carried"
            raise
        except grpc.aio.AioRpcError as exc:
            code, details = exc.code(), exc.details() or ""
            raise
        finally:
            stream.pending.pop(header.id, None)
            if span is not None:
                end_client_span(span, code, details)

    def _open(self) -> _OpenStream:
        if self._stream is None:
            # The stream outlives the turn that opens it: it runs for no principal and in no
            # trace (each carried call has its own); its tasks inherit both.
            principal = current_principal.set(None)
            detached = otel_context.attach(trace.set_span_in_context(trace.INVALID_SPAN))
            try:
                self._stream = _OpenStream(self._open_stream(), self._unwrap, self._stream_failure, self._ended)
            finally:
                otel_context.detach(detached)
                current_principal.reset(principal)
        return self._stream

    def _ended(self, stream: _OpenStream) -> None:
        if self._stream is stream:
            self._stream = None

    def _stream_failure(self, exc: BaseException) -> BaseException:
        """What the calls on a stream that ended with `exc` fail with: NotCarried when the
        server has no such stream (older), the stream's refusal as it is (UNAUTHENTICATED,
        PERMISSION_DENIED: the caller's calls would be refused too), else UNAVAILABLE — the
        peer went away, as a unary call would have found."""
        if not isinstance(exc, grpc.aio.AioRpcError):
            return _rpc_error(grpc.StatusCode.UNAVAILABLE, f"the stream to {self._peer} ended ({type(exc).__name__})")
        code: grpc.StatusCode = exc.code()
        details: str = exc.details() or code.name
        if code == grpc.StatusCode.UNIMPLEMENTED:
            self.unsupported = True
            return NotCarried(details)
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            refusal: BaseException = exc
            return refusal
        log.info("carried calls' stream ended", method=self._method, peer=self._peer, code=code.name)
        return _rpc_error(grpc.StatusCode.UNAVAILABLE, f"the stream to {self._peer} ended: {details}")

    async def close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.end(asyncio.CancelledError())
            await asyncio.sleep(0)  # let its tasks finish cancelling


_CODES = {code.value[0]: code for code in grpc.StatusCode}


class CarriedCalls(Generic[_Request, _Response]):
    """The server's side: serves a stream of carried `full_method` calls with `handle`, each as
    `ServerCalls.carried` serves a call, concurrently (in a task each), answering each as it
    finishes. `unwrap(message)` splits a stream message into its CarriedCall and request;
    `wrap(status, response)` makes the answer."""

    def __init__(self, calls: ServerCalls, full_method: str, handle: Callable[[_Request], Awaitable[_Response]], *,
                 unwrap: Callable[[Any], tuple[common_pb2.CarriedCall, _Request]],
                 wrap: Callable[[common_pb2.CarriedStatus, _Response | None], Any]):
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

        async def one(header: common_pb2.CarriedCall, request: _Request) -> None:
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
