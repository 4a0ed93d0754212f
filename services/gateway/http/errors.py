"""gRPC status -> HTTP status, and the JSON shape of an error.

The code name and the sentence are exactly what a gRPC client gets; only the HTTP status is added.

    {"error": {"code": "NOT_FOUND", "message": "session 'x' does not exist", "http_status": 404}}
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

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


def error_body(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "http_status": HTTP_STATUS.get(code, 500)}}


def error_response(code: str, message: str) -> web.Response:
    status = HTTP_STATUS.get(code, 500)
    headers = {"WWW-Authenticate": 'Bearer realm="agentmesh"'} if status == 401 else None
    return web.json_response(error_body(code, message), status=status, headers=headers)
