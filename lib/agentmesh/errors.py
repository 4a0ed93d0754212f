"""Errors the service cores raise; the gRPC adapters turn them into status codes.

Cores know nothing of gRPC, so they raise these and `agentmesh.rpc.errors` maps each to
the status a client should see, with the message written for a person, and a reason with
metadata for a program (`agentmesh.error_reasons`; sent as a google.rpc.ErrorInfo).
"""

from __future__ import annotations

from collections.abc import Mapping

from agentmesh import error_reasons as reasons

__all__ = [
    "AgentmeshError",
    "AlreadyExists",
    "ConfigError",
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
    """Base class; `code` is the gRPC status name the adapter answers with, `reason` (one of
    `agentmesh.error_reasons`) and `metadata` what a program reads: the class's generic
    reason unless the raise site names a specific one. `field`: the request field at fault
    (metadata `field`), for an InvalidArgument above all."""

    code = "INTERNAL"
    default_reason = reasons.INTERNAL_ERROR

    def __init__(self, message: str, *, reason: str = "", metadata: Mapping[str, str] | None = None,
                 field: str = ""):
        super().__init__(message)
        self.message = message
        self.reason = reason or self.default_reason
        self.metadata: dict[str, str] = dict(metadata or {})
        if field:
            self.metadata["field"] = field


class InvalidArgument(AgentmeshError):
    code = "INVALID_ARGUMENT"
    default_reason = reasons.INVALID_ARGUMENT


class NotFound(AgentmeshError):
    code = "NOT_FOUND"
    default_reason = reasons.NOT_FOUND


class AlreadyExists(AgentmeshError):
    code = "ALREADY_EXISTS"
    default_reason = reasons.ALREADY_EXISTS


class FailedPrecondition(AgentmeshError):
    code = "FAILED_PRECONDITION"
    default_reason = reasons.FAILED_PRECONDITION


class Unavailable(AgentmeshError):
    code = "UNAVAILABLE"
    default_reason = reasons.SERVICE_UNAVAILABLE


class PermissionDenied(AgentmeshError):
    code = "PERMISSION_DENIED"
    default_reason = reasons.PERMISSION_DENIED


class Unauthenticated(AgentmeshError):
    code = "UNAUTHENTICATED"
    default_reason = reasons.UNAUTHENTICATED


class ResourceExhausted(AgentmeshError):
    code = "RESOURCE_EXHAUSTED"
    default_reason = reasons.RESOURCE_EXHAUSTED


class DeadlineExceeded(AgentmeshError):
    code = "DEADLINE_EXCEEDED"
    default_reason = reasons.DEADLINE_EXCEEDED


class ConfigError(ValueError):
    """A setting in the environment is missing or malformed; the message names it. Not a status
    of any call: it stops a service at start-up (raised by `agentmesh.config` and the files it
    reads, such as `agentmesh.models`' AGENTMESH_MODELS, so it lives below both)."""


def error_of_code(code: str, message: str, *, reason: str = "", metadata: Mapping[str, str] | None = None) -> AgentmeshError:
    """The exception whose `code` is `code` (a status name, as a RunError or a peer's status
    carries it), with the reason and metadata it came with; the base class (INTERNAL) for a
    name none has."""
    for cls in (InvalidArgument, NotFound, AlreadyExists, FailedPrecondition, Unavailable, PermissionDenied,
                Unauthenticated, ResourceExhausted, DeadlineExceeded):
        if cls.code == code:
            return cls(message, reason=reason, metadata=metadata)
    return AgentmeshError(message, reason=reason, metadata=metadata)
