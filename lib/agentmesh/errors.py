"""Errors the service cores raise; the gRPC adapters turn them into status codes.

Cores know nothing of gRPC, so they raise these and `agentmesh.rpc.errors` maps each to
the status a client should see, with the message written for a person.
"""

from __future__ import annotations

__all__ = [
    "AgentmeshError",
    "AlreadyExists",
    "DeadlineExceeded",
    "FailedPrecondition",
    "InvalidArgument",
    "NotFound",
    "PermissionDenied",
    "ResourceExhausted",
    "Unauthenticated",
    "Unavailable",
    "error_of_code",
]


class AgentmeshError(Exception):
    """Base class; `code` is the gRPC status name the adapter answers with."""

    code = "INTERNAL"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InvalidArgument(AgentmeshError):
    code = "INVALID_ARGUMENT"


class NotFound(AgentmeshError):
    code = "NOT_FOUND"


class AlreadyExists(AgentmeshError):
    code = "ALREADY_EXISTS"


class FailedPrecondition(AgentmeshError):
    code = "FAILED_PRECONDITION"


class Unavailable(AgentmeshError):
    code = "UNAVAILABLE"


class PermissionDenied(AgentmeshError):
    code = "PERMISSION_DENIED"


class Unauthenticated(AgentmeshError):
    code = "UNAUTHENTICATED"


class ResourceExhausted(AgentmeshError):
    code = "RESOURCE_EXHAUSTED"


class DeadlineExceeded(AgentmeshError):
    code = "DEADLINE_EXCEEDED"


def error_of_code(code: str, message: str) -> AgentmeshError:
    """The exception whose `code` is `code` (a status name, as a RunError carries it); the base
    class (INTERNAL) for a name none has."""
    for cls in (InvalidArgument, NotFound, AlreadyExists, FailedPrecondition, Unavailable, PermissionDenied,
                Unauthenticated, ResourceExhausted, DeadlineExceeded):
        if cls.code == code:
            return cls(message)
    return AgentmeshError(message)
