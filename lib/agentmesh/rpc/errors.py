"""Translate core exceptions into gRPC statuses at the edge of every servicer method.

A status carries, besides its code and sentence, a `google.rpc.Status` in the
`grpc-status-details-bin` trailer — the richer error model of Google's APIs — holding a
`google.rpc.ErrorInfo` (reason, domain, metadata: agentmesh.error_reasons), and for a request
field at fault a `google.rpc.BadRequest` naming it. Clients read it with grpcio-status
(`grpc_status.rpc_status.from_call`); a peer's reason reaches the next caller unchanged
(`core_error_from_rpc`), so an error keeps its reason across every hop.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from typing import Any, AsyncIterator, Callable

import grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status
from opentelemetry import trace

from agentmesh import error_reasons
from agentmesh.errors import AgentmeshError, error_of_code
from agentmesh.logs import get_logger

__all__ = [
    "MAX_MESSAGE_BYTES",
    "STATUS_DETAILS_KEY",
    "abort_with",
    "core_error_from_rpc",
    "error_info_of",
    "internal_error_message",
    "status_code",
    "status_details",
    "translate_errors",
]

# Where gRPC carries a google.rpc.Status (grpcio-status reads and writes the same key).
STATUS_DETAILS_KEY = "grpc-status-details-bin"

log = get_logger("agentmesh.rpc")


def status_code(name: str) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, name, grpc.StatusCode.INTERNAL)


def internal_error_message(exc: BaseException) -> str:
    """Log an error no handler turned into a status; the INTERNAL status message for it."""
    log.error("unhandled error in handler", exc_info=exc)
    # The exception text stays in the (redacted) log: it may hold paths or credentials.
    trace_id = _trace_id()
    where = f"; trace {trace_id}" if trace_id else ""
    return f"internal error ({type(exc).__name__}); the service log has the details{where}"


def _trace_id() -> str:
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else ""


# The most of a status's sentence sent, in UTF-8 bytes. The sentence travels twice in the
# trailers (grpc-message, and base64 inside the details), and clients refuse trailers past 8 KiB
# (gRPC's soft limit, 16 KiB hard): a 3000-character sentence already failed a third of its
# calls. 1500 bytes stays under the soft limit even when every byte is percent-encoded.
MAX_MESSAGE_BYTES = 1500


def _bounded(message: str) -> str:
    encoded = message.encode()
    if len(encoded) <= MAX_MESSAGE_BYTES:
        return message
    return encoded[:MAX_MESSAGE_BYTES - 3].decode(errors="ignore") + "…"


def status_details(code: grpc.StatusCode, message: str, reason: str = "",
                   metadata: Mapping[str, str] | None = None) -> grpc.Status:
    """The status to answer with: `code` and `message` (cut at MAX_MESSAGE_BYTES), and in its
    details an ErrorInfo with `reason` (the code's generic one when empty) and `metadata`, and a
    BadRequest naming the field when metadata has one."""
    message = _bounded(message)
    info = error_details_pb2.ErrorInfo(reason=reason or error_reasons.default_reason(code.name),
                                       domain=error_reasons.DOMAIN, metadata=dict(metadata or {}))
    status = status_pb2.Status(code=code.value[0], message=message)
    status.details.add().Pack(info)
    if "field" in info.metadata:
        # The sentence is in the status already: a short description keeps the trailers small.
        violation = error_details_pb2.BadRequest.FieldViolation(field=info.metadata["field"],
                                                                description=f"see the status message ({info.reason})")
        status.details.add().Pack(error_details_pb2.BadRequest(field_violations=[violation]))
    return rpc_status.to_status(status)


async def abort_with(context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str, reason: str = "",
                     metadata: Mapping[str, str] | None = None) -> None:
    """End the call with `code`, `message` and the ErrorInfo of `reason` (raises AbortError)."""
    status = status_details(code, message, reason, metadata)
    await context.abort(status.code, status.details, status.trailing_metadata)


def error_info_of(err: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo | None:
    """The ErrorInfo of a status a peer answered with; None when it sent none (a status gRPC
    itself made, or an older service)."""
    for key, value in err.trailing_metadata() or ():
        if key != STATUS_DETAILS_KEY or not isinstance(value, bytes):
            continue
        status = status_pb2.Status()
        try:
            status.MergeFromString(value)
        except Exception:  # noqa: BLE001 - undecodable details are no details; the code still holds
            return None
        for detail in status.details:
            info = error_details_pb2.ErrorInfo()
            if detail.Unpack(info):
                return info
    return None


async def _abort(context: grpc.aio.ServicerContext, exc: BaseException) -> None:
    if isinstance(exc, AgentmeshError):
        await abort_with(context, status_code(exc.code), exc.message, exc.reason, exc.metadata)
    message = internal_error_message(exc)
    trace_id = _trace_id()
    await abort_with(context, grpc.StatusCode.INTERNAL, message, error_reasons.INTERNAL_ERROR,
                     {"trace_id": trace_id} if trace_id else None)


def translate_errors(method: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a servicer method (coroutine or async generator) so core errors become statuses."""
    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def stream_wrapper(self: Any, request: Any, context: Any) -> AsyncIterator[Any]:
            try:
                async for item in method(self, request, context):
                    yield item
            except (grpc.aio.AbortError, GeneratorExit, KeyboardInterrupt):
                raise
            except Exception as exc:  # noqa: BLE001 - every error must become a status
                await _abort(context, exc)

        return stream_wrapper

    @functools.wraps(method)
    async def unary_wrapper(self: Any, request: Any, context: Any) -> Any:
        try:
            return await method(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # noqa: BLE001 - every error must become a status
            await _abort(context, exc)

    return unary_wrapper


def core_error_from_rpc(err: grpc.aio.AioRpcError) -> AgentmeshError:
    """The reverse direction: a peer's status as the matching core exception, with the reason
    and metadata the peer gave it (the code's generic reason when it gave none)."""
    info = error_info_of(err)
    return error_of_code(err.code().name, err.details() or err.code().name,
                         reason=info.reason if info is not None else "",
                         metadata=dict(info.metadata) if info is not None else None)
