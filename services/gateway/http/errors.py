"""gRPC status -> HTTP status, and the JSON shape of an error.

The code name, the sentence and the ErrorInfo (reason, domain, metadata) are exactly what a
gRPC client gets; only the HTTP status is added.

    {"error": {"code": "NOT_FOUND", "message": "session 'x' does not exist", "http_status": 404,
               "reason": "NOT_FOUND", "domain": "agentmesh.dev", "metadata": {}}}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import grpc
from aiohttp import web

from agentmesh import error_reasons
from agentmesh.errors import AgentmeshError
from agentmesh.rpc.errors import error_info_of

HTTP_STATUS = {
    "OK": 200,
    "CANCELLED": 499,
    "UNKNOWN": 500,
    "INVALID_ARGUMENT": 400,
    "DEADLINE_EXCEEDED": 504,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "PERMISSION_DENIED": 403,
    "UNAUTHENTICATED": 401,
    "RESOURCE_EXHAUSTED": 429,
    "FAILED_PRECONDITION": 409,
    "ABORTED": 409,
    "OUT_OF_RANGE": 400,
    "UNIMPLEMENTED": 501,
    "INTERNAL": 500,
    "UNAVAILABLE": 503,
    "DATA_LOSS": 500,
}


def error_body(code: str, message: str, reason: str = "", metadata: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The error object; `reason` empty: the code's generic one (a status gRPC made itself)."""
    return {"error": {"code": code, "message": message, "http_status": HTTP_STATUS.get(code, 500),
                      "reason": reason or error_reasons.default_reason(code), "domain": error_reasons.DOMAIN,
                      "metadata": dict(metadata or {})}}


def error_of(exc: AgentmeshError | grpc.aio.AioRpcError) -> dict[str, Any]:
    """The error object of a core exception or of a status the gRPC API answered."""
    if isinstance(exc, AgentmeshError):
        return error_body(exc.code, exc.message, exc.reason, exc.metadata)
    info = error_info_of(exc)
    return error_body(exc.code().name, exc.details() or exc.code().name, info.reason if info else "",
                      info.metadata if info else None)


def error_response(code: str, message: str, reason: str = "", metadata: Mapping[str, str] | None = None) -> web.Response:
    return json_error(error_body(code, message, reason, metadata))


def json_error(body: dict[str, Any]) -> web.Response:
    status = body["error"]["http_status"]
    headers = {"WWW-Authenticate": 'Bearer realm="agentmesh"'} if status == 401 else None
    return web.json_response(body, status=status, headers=headers)
