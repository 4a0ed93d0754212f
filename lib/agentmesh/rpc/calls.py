"""The one server interceptor every call a service serves goes through.

Around each call, in this order:
1. its SERVER span, continuing the caller's trace (`traceparent` in the metadata), current while
   the handler runs — not for health probes and reflection, which are not turns;
2. `rpc.server.duration`, recorded when the call ends (a stream: at its last message or its
   end), with the final status — refusals and probes included;
3. the caller check (auth.CallerCheck): a refused call is answered with its status without
   the request being read; an admitted one runs as its principal;
4. a request that does not decode as protobuf is answered INVALID_ARGUMENT (guard.py).

One interceptor rather than four: each grpc.aio server interceptor is an `await` and a rebuilt
handler more per call, and each wrapper a coroutine frame (a generator re-yielding every
message, for a stream) more — about 0.1-0.2 ms of CPU a call in all (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any, AsyncIterator, Awaitable, Callable

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace

from agentmesh import error_reasons
from agentmesh.errors import AgentmeshError
from agentmesh.rpc.auth import OPEN_PREFIXES, CallerCheck
from agentmesh.rpc.errors import abort_with, internal_error_message, status_code
from agentmesh.rpc.guard import MALFORMED, lenient, malformed_message
from agentmesh.rpc.handlers import behaviour_of, refusal
from agentmesh.rpc.identity import Principal
from agentmesh.telemetry.instruments import ServiceMetrics
from agentmesh.telemetry.rpcspans import LONG_LIVED_STREAMS, rpc_attributes, server_span_status, start_server_span

__all__ = ["ServerCalls"]

# Probes and reflection are not turns: no trace for each of them (they are still measured).
# Nor are the streams that live as long as the service (the agent's catalog watch, carried
# calls): part of no turn, each span would be a trace of its own, hours long.
_UNTRACED_PREFIXES = (*OPEN_PREFIXES, *LONG_LIVED_STREAMS)


class _Method:
    """What is the same for every call of one method, worked out once."""

    __slots__ = ("attributes", "by_code", "checked", "full_name", "traced")

    def __init__(self, full_name: str, checked: bool):
        self.full_name = full_name
        self.attributes = rpc_attributes(full_name)
        self.traced = not full_name.startswith(_UNTRACED_PREFIXES)
        self.checked = checked and not full_name.startswith(OPEN_PREFIXES)
        self.by_code: dict[int, dict[str, Any]] = {}

    def metric_attributes(self, code: grpc.StatusCode) -> dict[str, Any]:
        value = code.value[0]
        attributes = self.by_code.get(value)
        if attributes is None:
            attributes = self.by_code[value] = {**self.attributes, "rpc.grpc.status_code": value}
        return attributes


def _final_code(context: grpc.aio.ServicerContext, error: BaseException | None) -> grpc.StatusCode:
    try:
        code = context.code()
    except Exception:  # noqa: BLE001 - an older context without code(): fall back on the error
        code = None
    if isinstance(code, int):  # the core reports the numeric value
        code = next((c for c in grpc.StatusCode if c.value[0] == code), None)
    if code is not None and code != grpc.StatusCode.OK:
        return code
    if error is None:
        return grpc.StatusCode.OK
    if isinstance(error, (asyncio.CancelledError, GeneratorExit)):
        return grpc.StatusCode.CANCELLED
    # An exception the handler did not turn into a status: gRPC answers UNKNOWN.
    return grpc.StatusCode.UNKNOWN


class _Call:
    """One call being served: its span (or None), and what ends it."""

    __slots__ = ("method", "span", "started", "token")

    def __init__(self, calls: "ServerCalls", method: _Method, metadata: Any, principal: Principal | None):
        self.method = method
        self.started = time.perf_counter()
        self.span: trace.Span | None = None
        self.token: object = None
        if method.traced:
            carrier = dict(metadata or ())
            self.span, self.token = start_server_span(calls.tracer, method.full_name, method.attributes, carrier)
        if principal is not None and calls.callers is not None:
            calls.callers.enter(principal, self.span or trace.INVALID_SPAN)

    def end(self, calls: "ServerCalls", context: grpc.aio.ServicerContext, error: BaseException | None) -> None:
        code = _final_code(context, error)
        details = ""
        if code != grpc.StatusCode.OK and self.span is not None:
            try:
                details = context.details() or ""
            except Exception:  # noqa: BLE001 - the status message is a nicety on the span
                details = ""
            if isinstance(details, bytes):
                details = details.decode("utf-8", "replace")
        self.end_with(calls, code, details, error)

    def end_with(self, calls: "ServerCalls", code: grpc.StatusCode, details: str, error: BaseException | None) -> None:
        span = self.span
        if span is not None:
            server_span_status(span, code, details)
            if error is not None and not isinstance(error, (grpc.aio.AbortError, asyncio.CancelledError, GeneratorExit)):
                span.record_exception(error)
            span.end()
            otel_context.detach(self.token)  # type: ignore[arg-type]  # the token attach() gave
        calls.metrics.rpc_server_duration.record((time.perf_counter() - self.started) * 1000.0,
                                                 self.method.metric_attributes(code))


class ServerCalls(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc ships no types
    def __init__(self, tracer: trace.Tracer, metrics: ServiceMetrics, callers: CallerCheck | None = None):
        self.tracer = tracer
        self.metrics = metrics
        self.callers = callers
        self._methods: dict[str, _Method] = {}
        self._lenient: dict[Any, Callable[[bytes], Any]] = {}

    def _method(self, full_name: str) -> _Method:
        method = self._methods.get(full_name)
        if method is None:
            method = self._methods[full_name] = _Method(full_name, self.callers is not None)
        return method

    async def intercept_service(self, continuation: Any, handler_call_details: Any) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = self._method(handler_call_details.method)
        metadata = handler_call_details.invocation_metadata
        principal: Principal | None = None
        if method.checked:
            assert self.callers is not None
            decision = await self.callers.admit(method.full_name, metadata)
            if not isinstance(decision, Principal):
                return self._wrap(refusal(handler, *decision, method.full_name), method, metadata, None, guarded=False)
            principal = decision
        return self._wrap(handler, method, metadata, principal, guarded=True)

    async def carried(self, full_method: str, metadata: tuple[tuple[str, str], ...], request: Any,
                      handle: Callable[[Any], Awaitable[Any]], *,
                      timeout_s: float = 0.0) -> tuple[grpc.StatusCode, str, Any]:
        """Serve one call carried on a stream (carried.py) as a call of `full_method` is served:
        its caller checked from `metadata`, its SERVER span and duration, the handler run as its
        principal, stopped after `timeout_s` (0: no deadline) with DEADLINE_EXCEEDED; core errors
        become statuses as translate_errors makes them. Returns the status, its message and the
        handler's answer (None unless OK). Run it in a task of its own: it sets the principal
        for what the handler does, and cancelling the task cancels the call."""
        method = self._method(full_method)
        principal: Principal | None = None
        if method.checked:
            assert self.callers is not None
            decision = await self.callers.admit(full_method, metadata)
            if not isinstance(decision, Principal):
                refused = _Call(self, method, metadata, None)
                refused.end_with(self, decision[0], decision[1], None)
                return decision[0], decision[1], None
            principal = decision
        call = _Call(self, method, metadata, principal)
        deadline = asyncio.timeout(timeout_s if timeout_s > 0 else None)
        try:
            async with deadline:
                answer = await handle(request)
        except TimeoutError as exc:
            if not deadline.expired():
                details = internal_error_message(exc)
                call.end_with(self, grpc.StatusCode.INTERNAL, details, exc)
                return grpc.StatusCode.INTERNAL, details, None
            call.end_with(self, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", None)
            return grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", None
        except AgentmeshError as exc:
            code, details = status_code(exc.code), exc.message
            call.end_with(self, code, details, None)
            return code, details, None
        except Exception as exc:  # noqa: BLE001 - every error must become a status
            details = internal_error_message(exc)
            call.end_with(self, grpc.StatusCode.INTERNAL, details, exc)
            return grpc.StatusCode.INTERNAL, details, None
        except BaseException as exc:
            call.end_with(self, grpc.StatusCode.CANCELLED, "", exc)
            raise
        call.end_with(self, grpc.StatusCode.OK, "", None)
        return grpc.StatusCode.OK, "", answer

    def _decoder(self, deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any]:
        decoder = self._lenient.get(deserializer)
        if decoder is None:
            decoder = self._lenient[deserializer] = lenient(deserializer)
        return decoder

    def _wrap(self, handler: grpc.RpcMethodHandler, method: _Method, metadata: Any, principal: Principal | None,
              *, guarded: bool) -> grpc.RpcMethodHandler:
        inner = behaviour_of(handler)
        request_streaming = handler.request_streaming
        calls = self
        invalid = malformed_message(handler.request_deserializer) if guarded else ""

        async def checked(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async for request in requests:
                if request is MALFORMED:
                    await abort_with(context, grpc.StatusCode.INVALID_ARGUMENT, invalid, error_reasons.MALFORMED_REQUEST)
                yield request

        if handler.response_streaming:

            async def streaming(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                call = _Call(calls, method, metadata, principal)
                error: BaseException | None = None
                try:
                    if guarded:
                        if request_streaming:
                            request = checked(request, context)
                        elif request is MALFORMED:
                            await abort_with(context, grpc.StatusCode.INVALID_ARGUMENT, invalid, error_reasons.MALFORMED_REQUEST)
                    result = inner(request, context)
                    if hasattr(result, "__aiter__"):
                        async for response in result:
                            yield response
                    else:  # a handler that writes with context.write() and returns nothing
                        await result
                except BaseException as exc:
                    error = exc
                    raise
                finally:
                    call.end(calls, context, error)

            behaviour: Callable[..., Any] = streaming
        else:

            async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                call = _Call(calls, method, metadata, principal)
                error: BaseException | None = None
                try:
                    if guarded:
                        if request_streaming:
                            request = checked(request, context)
                        elif request is MALFORMED:
                            await abort_with(context, grpc.StatusCode.INVALID_ARGUMENT, invalid, error_reasons.MALFORMED_REQUEST)
                    result = inner(request, context)
                    return (await result) if inspect.isawaitable(result) else result
                except BaseException as exc:
                    error = exc
                    raise
                finally:
                    call.end(calls, context, error)

            behaviour = unary

        deserializer = self._decoder(handler.request_deserializer) if guarded else handler.request_deserializer
        serializer = handler.response_serializer
        if request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(behaviour, deserializer, serializer)
        if request_streaming:
            return grpc.stream_unary_rpc_method_handler(behaviour, deserializer, serializer)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(behaviour, deserializer, serializer)
        return grpc.unary_unary_rpc_method_handler(behaviour, deserializer, serializer)
