"""Unary calls carried as messages on one long-lived bidirectional stream.

Why: on grpc.aio a unary call between two processes costs ~0.46 ms of CPU (caller and server
together) and ~0.40 ms of latency on this project's 2-core machine; a message each way on a
stream that is already open, 0.16 ms and 0.2 ms (`python -m benches.rpc_call`, `benches.idle_hops`). The calls
on a turn's critical path ride one stream per (caller process, service) instead: the agent's
transcript appends and its StartTurn on `Memory.CarriedCalls`, its tool calls on
`Tools.CarriedCalls`. One stream carries several methods: its request message is a `CarriedCall`
header beside a oneof with one field per method, its answer a `CarriedStatus` beside the same
oneof of responses.

A carried call is still a call in everything but its transport:
- it carries its own signed service token, checked by the server exactly as a call's
  metadata is (`ServerCalls.carried`: the same caller check, the same principal and tenant
  scope for its handler);
- it has its own CLIENT and SERVER span, named and attributed as the unary method's, so a
  trace reads the same; its own `rpc.server.duration`; and its own status: a refusal or a
  core error comes back as the gRPC code and message the unary call would have had, raised at
  the caller as `grpc.aio.AioRpcError`, so `peer_call` and retries treat both alike;
- its deadline goes with it (`CarriedCall.timeout_s`): the server stops the call then and
  answers DEADLINE_EXCEEDED, as it stops a unary call past its deadline;
- its cancellation goes too: a caller that stops waiting (cancelled, or past its timeout)
  after the call was written sends a cancel for it, and the server cancels the call's task —
  a tool call's sandboxed process is killed as when the unary call is cancelled. A call not yet
  written when its caller stops waiting is never written;
- the stream is opened lazily and opened again after it breaks; calls in flight when it
  breaks fail with UNAVAILABLE (the unary call's failure when its peer goes away), and the
  server cancels every call of a stream that ends;
- requests larger than `CARRY_LIMIT_BYTES` go as unary calls (`NotCarried`): one stream's flow
  control would make every other call wait behind a large one. Answers are the server's: a
  method whose answer can grow (StartTurn's transcript) bounds it when carried and lets the
  caller page the rest; a tool call's answer is bounded by the tools service's output caps,
  and goes whole; an answer too large for the caller's channel fails its call alone
  (RESOURCE_EXHAUSTED), as the unary call would, instead of ending the stream;
- a server without the stream, or without one of its methods (a oneof field it does not know),
  answers UNIMPLEMENTED, as it would the unary call of a method it does not have: no unary
  call is made instead. A service supports peers one minor version back, and every version
  that has these streams carries these methods (docs/architecture.md, "Versions a service
  talks to").

What it changes: which replica serves. round_robin picks a replica per call; a stream is one
call, so every call a caller process carries goes to the replica its stream reached, until the
stream breaks (that replica drains or goes away) and the next is opened on the next pick. Load
spreads per caller process, not per call: with several agent replicas the streams spread over
the memory and tools replicas as calls did; one agent process drives one replica of each.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import itertools
from typing import Any, AsyncIterator, Awaitable, Callable, Generic, Mapping, TypeVar, cast

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace

from agentmesh.logs import get_logger
from agentmesh.rpc.auth import SERVICE_TOKEN_HEADER, current_principal
from agentmesh.rpc.calls import ServerCalls
from agentmesh.rpc.identity import ServiceIdentity
from agentmesh.rpc.server import MAX_MESSAGE_BYTES
from agentmesh.telemetry.rpcspans import end_client_span, rpc_attributes, start_carried_client_span
from agentmesh.v1 import common_pb2

__all__ = ["CARRY_LIMIT_BYTES", "MAX_ANSWER_BYTES", "MAX_STREAMS", "NOT_CARRIED_HERE", "CarriedCalls", "CarriedClient",
           "CarriedMethod", "NotCarried", "ServedMethod", "oneof_answers", "oneof_requests"]

log = get_logger("agentmesh.rpc")

# Above this a request goes as a unary call of its own (see the module's docstring).
CARRY_LIMIT_BYTES = 256 * 1024

# The largest answer a carried call may have: a message on the stream is bounded by what the
# caller's channel receives (MAX_MESSAGE_BYTES), less room for the answer's status.
MAX_ANSWER_BYTES = MAX_MESSAGE_BYTES - 64 * 1024

# Streams one caller keeps to one service at most. A stream writes one message at a time, each
# write a trip through grpc.aio's completion queue and the event loop, and the server answers
# on it one message at a time too: with a thousand turns in flight one stream became a queue of
# seconds (benches/concurrent_turns.py). A call goes on a stream with nothing waiting to be
# written — another is opened while there are fewer than this — so one turn at a time still
# uses one stream, and a burst spreads over several that write side by side.
MAX_STREAMS = 64

# How the server answers a call of a method it does not carry (a oneof field it does not know).
NOT_CARRIED_HERE = "this server does not carry that method on this stream"

_Request = TypeVar("_Request")
_Response = TypeVar("_Response")


class NotCarried(Exception):
    """The request is too large to carry: make the unary call instead."""


def _rpc_error(code: grpc.StatusCode, details: str) -> BaseException:
    error: BaseException = grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)
    return error


class _OpenStream:
    """One open stream: its calls waiting for answers, and the two tasks that write its messages
    and read its answers. A caller only ever awaits its own future, so asyncio.timeout and
    cancellation act on it at once — never inside grpc.aio's call machinery, which can hold a
    cancellation while it waits for the peer."""

    def __init__(self, call: Any, failure_of: Callable[[BaseException], BaseException],
                 on_end: Callable[["_OpenStream"], None]):
        self.call = call
        self._failure_of = failure_of
        self._on_end = on_end
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.written: set[int] = set()  # calls written and not yet answered or cancelled
        self._outbox: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self._writing = False
        self._writer = asyncio.get_running_loop().create_task(self._write())
        self._reader = asyncio.get_running_loop().create_task(self._read())
        self.ended = False

    @property
    def backlog(self) -> int:
        """Messages waiting to be written, the one being written included."""
        return self._outbox.qsize() + self._writing

    def send(self, call_id: int, message: Any) -> asyncio.Future[Any]:
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending[call_id] = answer
        self._outbox.put_nowait((call_id, message))
        return answer

    def cancel(self, call_id: int, message: Any) -> None:
        """The caller stopped waiting for `call_id`: tell the server, if the call was written."""
        if call_id in self.written and not self.ended:
            self.written.discard(call_id)
            self._outbox.put_nowait((0, message))

    async def _write(self) -> None:
        try:
            # Connected first (the channel may wait for a restarting peer): a message is written
            # only once it can go at once, so one whose caller has stopped waiting is never sent
            # late — an append the caller gave up on (and will retry) must not land after all.
            await self.call.wait_for_connection()
            while True:
                call_id, message = await self._outbox.get()
                self._writing = True
                if not call_id:  # a cancel, queued only for a call already written
                    await self.call.write(message)
                elif call_id in self.pending:
                    self.written.add(call_id)
                    await self.call.write(message)
                self._writing = False
        except asyncio.CancelledError:
            pass
        except grpc.aio.AioRpcError as exc:
            self.end(exc)
        except (asyncio.InvalidStateError, grpc.aio.UsageError):
            # The stream ended before this write: fail its calls with how it ended, whichever of
            # writer and reader sees it first.
            self.end(_rpc_error(await self.call.code(), await self.call.details() or ""))

    async def _read(self) -> None:
        try:
            async for message in self.call:
                status = message.status
                answer = self.pending.pop(status.id, None)
                self.written.discard(status.id)
                if answer is not None and not answer.done():
                    answer.set_result(message)
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
        self.written.clear()
        current = asyncio.current_task()
        for task in (self._writer, self._reader):
            if task is not current:
                task.cancel()
        self.call.cancel()


class CarriedClient:
    """The caller's side of the streams to one service, e.g. `Memory.CarriedCalls`: opened by
    `open_stream()` on a channel that signs the stream itself; `message_type` is its request
    message (a `call` CarriedCall header and a oneof `request`). Each carried method is a
    `CarriedMethod` from `method()`. One stream while calls come one at a time; up to
    MAX_STREAMS while they come faster than one stream writes them."""

    def __init__(self, open_stream: Callable[[], Any], message_type: Callable[..., Any], *,
                 identity: ServiceIdentity | None, audience: str, tracer: trace.Tracer | None, peer: str):
        self._open_stream = open_stream
        self._message_type = message_type
        self._identity = identity
        self._audience = audience
        self._tracer = tracer
        self._peer = peer
        self._ids = itertools.count(1)
        self._streams: list[_OpenStream] = []

    def method(self, full_method: str, field: str) -> "CarriedMethod[Any, Any]":
        """`full_method` (e.g. "/agentmesh.internal.v1.Memory/StartTurn") carried as the oneof `field`."""
        return CarriedMethod(self, full_method, field)

    async def call(self, method: "CarriedMethod[Any, Any]", request: Any, timeout: float) -> Any:
        if request.ByteSize() > CARRY_LIMIT_BYTES:
            raise NotCarried("too large to carry")
        span, carrier = (None, {}) if self._tracer is None else start_carried_client_span(
            self._tracer, method.full_method, method.attributes)
        header = common_pb2.CarriedCall(
            id=next(self._ids),
            service_token=self._identity.token(self._audience, current_principal.get()) if self._identity else "",
            traceparent=carrier.get("traceparent", ""),
            tracestate=carrier.get("tracestate", ""),
            timeout_s=timeout,
        )
        code, details = grpc.StatusCode.CANCELLED, "the caller stopped waiting"
        answered = False
        stream = self._open()
        try:
            try:
                async with asyncio.timeout(timeout):
                    answer = await stream.send(header.id, self._message_type(call=header, **{method.field: request}))
            except TimeoutError:
                code, details = grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"
                raise _rpc_error(code, details) from None
            answered = True
            status = answer.status
            code, details = _CODES.get(status.code, grpc.StatusCode.UNKNOWN), status.message
            if code != grpc.StatusCode.OK:
                raise _rpc_error(code, details)
            return getattr(answer, method.field)
        except grpc.aio.AioRpcError as exc:
            code, details = exc.code(), exc.details() or ""
            raise
        finally:
            stream.pending.pop(header.id, None)
            if not answered:
                # Cancelled, or past its deadline: stop the call at the server too.
                stream.cancel(header.id, self._message_type(call=common_pb2.CarriedCall(id=header.id, cancel=True)))
            if span is not None:
                end_client_span(span, code, details)

    def _open(self) -> _OpenStream:
        """A stream with nothing waiting to be written; else a new one, up to MAX_STREAMS; else
        the one with the fewest messages waiting."""
        least: _OpenStream | None = None
        for stream in self._streams:
            if not stream.backlog:
                return stream
            if least is None or stream.backlog < least.backlog:
                least = stream
        if least is not None and len(self._streams) >= MAX_STREAMS:
            return least
        # The stream outlives the turn that opens it: it runs for no principal and in no
        # trace (each carried call has its own); its tasks inherit both.
        principal = current_principal.set(None)
        detached = otel_context.attach(trace.set_span_in_context(trace.INVALID_SPAN))
        try:
            opened = _OpenStream(self._open_stream(), self._stream_failure, self._ended)
        finally:
            otel_context.detach(detached)
            current_principal.reset(principal)
        self._streams.append(opened)
        return opened

    def _ended(self, stream: _OpenStream) -> None:
        if stream in self._streams:
            self._streams.remove(stream)

    def _stream_failure(self, exc: BaseException) -> BaseException:
        """What the calls on a stream that ended with `exc` fail with: the stream's refusal as it
        is (UNAUTHENTICATED, PERMISSION_DENIED: the caller's calls would be refused too;
        UNIMPLEMENTED: a server without the stream), else UNAVAILABLE — the peer went away, as a
        unary call would have found."""
        if not isinstance(exc, grpc.aio.AioRpcError):
            return _rpc_error(grpc.StatusCode.UNAVAILABLE, f"the stream to {self._peer} ended ({type(exc).__name__})")
        code: grpc.StatusCode = exc.code()
        details: str = exc.details() or code.name
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNIMPLEMENTED):
            refusal: BaseException = exc
            return refusal
        log.info("carried calls' stream ended", peer=self._peer, code=code.name)
        return _rpc_error(grpc.StatusCode.UNAVAILABLE, f"the stream to {self._peer} ended: {details}")

    async def close(self) -> None:
        streams, self._streams = self._streams, []
        for stream in streams:
            stream.end(asyncio.CancelledError())
        if streams:
            await asyncio.sleep(0)  # let their tasks finish cancelling


class CarriedMethod(Generic[_Request, _Response]):
    """One method carried on a `CarriedClient`'s stream: `await call(request, timeout)` as the
    unary call of `full_method`; NotCarried when the request is too large to carry (make the
    unary call)."""

    def __init__(self, client: CarriedClient, full_method: str, field: str):
        self.full_method = full_method
        self.field = field
        self.attributes = rpc_attributes(full_method)
        self._client = client

    async def call(self, request: _Request, timeout: float) -> _Response:
        return cast(_Response, await self._client.call(self, request, timeout))


_CODES = {code.value[0]: code for code in grpc.StatusCode}


class ServedMethod:
    """A method a `CarriedCalls` stream serves: its full name (its token is checked, its span
    named and its duration recorded as that method's) and its handler."""

    __slots__ = ("full_method", "handle")

    def __init__(self, full_method: str, handle: Callable[[Any], Awaitable[Any]]):
        self.full_method = full_method
        self.handle = handle


def oneof_requests(message: Any) -> tuple[common_pb2.CarriedCall, str | None, Any]:
    """A `call` header beside a oneof `request`: the header, the field set (None: none — a
    cancel, or a method this server's messages do not know) and its request."""
    field = message.WhichOneof("request")
    return message.call, field, getattr(message, field) if field else None


def oneof_answers(answer_type: Callable[..., Any]) -> Callable[[common_pb2.CarriedStatus, str, Any], Any]:
    """The answer message: a `status` beside a oneof `response` of the request's field."""
    def wrap(status: common_pb2.CarriedStatus, field: str, response: Any) -> Any:
        return answer_type(status=status) if response is None else answer_type(status=status, **{field: response})
    return wrap


class CarriedCalls:
    """The server's side: serves a stream of carried calls, each with its `methods` entry (by
    the request's field) as `ServerCalls.carried` serves a call, concurrently (in a task each),
    answering each as it finishes. `unwrap(message)` splits a stream message into its header,
    field and request (`oneof_requests`); `wrap(status, field, response)` makes the answer."""

    def __init__(self, calls: ServerCalls, methods: Mapping[str, ServedMethod], *,
                 unwrap: Callable[[Any], tuple[common_pb2.CarriedCall, str | None, Any]] = oneof_requests,
                 wrap: Callable[[common_pb2.CarriedStatus, str, Any], Any]):
        self._calls = calls
        self._methods = dict(methods)
        self._unwrap = unwrap
        self._wrap = wrap
        # Each open stream's answer queue and calls in flight (by id), for close().
        self._streams: dict[asyncio.Queue[Any], dict[int, asyncio.Task[None]]] = {}

    async def close(self, grace_s: float = 0.0) -> None:
        """End every open stream once its calls in flight are answered (a draining service):
        callers open their next stream to a replica that serves."""
        for answers, running in list(self._streams.items()):
            if running:
                await asyncio.wait(set(running.values()), timeout=grace_s or None)
            answers.put_nowait(None)

    async def serve(self, requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        answers: asyncio.Queue[Any] = asyncio.Queue()
        running: dict[int, asyncio.Task[None]] = {}
        self._streams[answers] = running

        async def one(header: common_pb2.CarriedCall, field: str, method: ServedMethod, request: Any) -> None:
            metadata = [(SERVICE_TOKEN_HEADER, header.service_token)] if header.service_token else []
            if header.traceparent:
                metadata.append(("traceparent", header.traceparent))
                if header.tracestate:
                    metadata.append(("tracestate", header.tracestate))
            code, details, response = await self._calls.carried(method.full_method, tuple(metadata), request,
                                                                method.handle, timeout_s=header.timeout_s)
            if response is not None and response.ByteSize() > MAX_ANSWER_BYTES:
                # Past what the caller's channel receives: that would end the stream, and every
                # call on it. This call alone fails, as the unary call would at the caller.
                code, details, response = grpc.StatusCode.RESOURCE_EXHAUSTED, (
                    f"the answer is {response.ByteSize()} bytes, more than the {MAX_ANSWER_BYTES} a carried "
                    "call's answer may be"), None
            answers.put_nowait(self._wrap(common_pb2.CarriedStatus(id=header.id, code=code.value[0], message=details),
                                          field, response))

        def finished(call_id: int, task: asyncio.Task[None]) -> None:
            if running.get(call_id) is task:
                del running[call_id]

        async def read() -> None:
            try:
                async for message in requests:
                    header, field, request = self._unwrap(message)
                    if header.cancel:
                        # The caller stopped waiting: cancelled as a unary call is (no answer).
                        task = running.get(header.id)
                        if task is not None:
                            task.cancel()
                        continue
                    method = self._methods.get(field) if field else None
                    if method is None or field is None:
                        answers.put_nowait(self._wrap(common_pb2.CarriedStatus(
                            id=header.id, code=grpc.StatusCode.UNIMPLEMENTED.value[0], message=NOT_CARRIED_HERE),
                            field or "", None))
                        continue
                    # A context of its own: the call's principal and span stay with it.
                    task = asyncio.get_running_loop().create_task(one(header, field, method, request),
                                                                  context=contextvars.copy_context())
                    running[header.id] = task
                    task.add_done_callback(functools.partial(finished, header.id))
                if running:
                    await asyncio.wait(set(running.values()))
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
            # The caller is gone (or the service stops): its calls are cancelled, as unary
            # calls are when their caller goes away.
            for task in list(running.values()):
                task.cancel()
