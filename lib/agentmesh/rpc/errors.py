"""Translate core exceptions into gRPC statuses at the edge of every servicer method."""

from __future__ import annotations

import functools
import inspect
from typing import Any, AsyncIterator, Callable

import grpc
from opentelemetry import trace

from agentmesh.errors import AgentmeshError
from agentmesh.logs import get_logger

__all__ = ["core_error_from_rpc", "internal_error_message", "status_code", "translate_errors"]

log = get_logger("agentmesh.rpc")


def status_code(name: str) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, name, grpc.StatusCode.INTERNAL)


def internal_error_message(exc: BaseException) -> str:
    """Log an error no handler turned into a status; the INTERNAL status message for it."""
    log.error("unhandled error in handler", exc_info=exc)
    # The exception text stays in the (redacted) log: it may hold paths or credentials.
    ctx = trace.get_current_span().get_span_context()
    where = f"; trace {format(ctx.trace_id, '032x')}" if ctx.is_valid else ""
    return f"internal error ({type(exc).__name__}); the service log has the details{where}"


async def _abort(context: grpc.aio.ServicerContext, exc: BaseException) -> None:
    if isinstance(exc, AgentmeshError):
        await context.abort(status_code(exc.code), exc.message)
    await context.abort(grpc.StatusCode.INTERNAL, internal_error_message(exc))


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
    """The reverse direction: a peer's status as the matching core exception."""
    from agentmesh import errors

    by_code = {cls.code: cls for cls in vars(errors).values() if isinstance(cls, type) and issubclass(cls, AgentmeshError)}
    cls = by_code.get(err.code().name, AgentmeshError)
    return cls(err.details() or err.code().name)
