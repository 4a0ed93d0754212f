"""The reasons an error carries, for programs: one vocabulary for every service and the gateway.

A status code says what kind of failure it was (NOT_FOUND, FAILED_PRECONDITION, ...); a reason
says which one, in words a program can switch on — a busy session, a quota, a malformed field —
without parsing the sentence meant for a person. Every error the gateway answers carries one in
a `google.rpc.ErrorInfo` (reason, DOMAIN, metadata) in the status details, as Google's APIs do,
and the HTTP error body repeats it (docs/api.md, "Error reasons").

Each `AgentmeshError` class has a default reason (its code's generic one, below); a raise site
that knows more names a specific reason from this module. `tests/test_error_reasons.py` checks
that every reason the code uses is listed here and documented in docs/api.md, and the reverse.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "AGENTS_FROM_RESOURCES",
    "ALREADY_EXISTS",
    "APPROVAL_NOT_FOUND",
    "BLOCK_DRAFT_NOT_FOUND",
    "BLOCK_FULL",
    "BLOCK_TEXT_NOT_FOUND",
    "BLOCK_VERSION_NOT_FOUND",
    "CANCELLED",
    "DEADLINE_EXCEEDED",
    "DOMAIN",
    "FAILED_PRECONDITION",
    "GATEWAY_LOST",
    "INTERNAL_ERROR",
    "INVALID_ARGUMENT",
    "MALFORMED_REQUEST",
    "NOT_FOUND",
    "NOT_RUN_OWNER",
    "PERMISSION_DENIED",
    "QUOTA_EXCEEDED",
    "REASONS",
    "REQUEST_TOO_LARGE",
    "RESOURCE_EXHAUSTED",
    "SEQ_OUT_OF_RANGE",
    "SERVICE_UNAVAILABLE",
    "SESSION_BUSY",
    "SHUTTING_DOWN",
    "TURN_TIMEOUT",
    "UNAUTHENTICATED",
    "UNIMPLEMENTED",
    "UNKNOWN_MODEL",
    "UNKNOWN_SANDBOX_TEMPLATE",
    "UNKNOWN_TOOL",
    "URL_REFUSED",
    "WATCHER_TOO_SLOW",
    "Reason",
    "default_reason",
]

# The ErrorInfo domain: who defines these reasons (Google's APIs use their service's name).
DOMAIN = "agentmesh.dev"


@dataclass(frozen=True)
class Reason:
    name: str
    code: str  # the gRPC status it comes with
    meaning: str


# Generic reasons: what an error carries when nothing more specific was said where it was raised.
INVALID_ARGUMENT = "INVALID_ARGUMENT"
NOT_FOUND = "NOT_FOUND"
ALREADY_EXISTS = "ALREADY_EXISTS"
FAILED_PRECONDITION = "FAILED_PRECONDITION"
PERMISSION_DENIED = "PERMISSION_DENIED"
UNAUTHENTICATED = "UNAUTHENTICATED"
RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
SERVICE_UNAVAILABLE = "SERVICE_UNAVAILABLE"
DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
UNIMPLEMENTED = "UNIMPLEMENTED"
CANCELLED = "CANCELLED"
INTERNAL_ERROR = "INTERNAL_ERROR"

# Specific reasons.
SESSION_BUSY = "SESSION_BUSY"
QUOTA_EXCEEDED = "QUOTA_EXCEEDED"
UNKNOWN_MODEL = "UNKNOWN_MODEL"
UNKNOWN_TOOL = "UNKNOWN_TOOL"
UNKNOWN_SANDBOX_TEMPLATE = "UNKNOWN_SANDBOX_TEMPLATE"
APPROVAL_NOT_FOUND = "APPROVAL_NOT_FOUND"
NOT_RUN_OWNER = "NOT_RUN_OWNER"
MALFORMED_REQUEST = "MALFORMED_REQUEST"
REQUEST_TOO_LARGE = "REQUEST_TOO_LARGE"
SHUTTING_DOWN = "SHUTTING_DOWN"
WATCHER_TOO_SLOW = "WATCHER_TOO_SLOW"
TURN_TIMEOUT = "TURN_TIMEOUT"
BLOCK_FULL = "BLOCK_FULL"
BLOCK_TEXT_NOT_FOUND = "BLOCK_TEXT_NOT_FOUND"
BLOCK_VERSION_NOT_FOUND = "BLOCK_VERSION_NOT_FOUND"
BLOCK_DRAFT_NOT_FOUND = "BLOCK_DRAFT_NOT_FOUND"
URL_REFUSED = "URL_REFUSED"
AGENTS_FROM_RESOURCES = "AGENTS_FROM_RESOURCES"
SEQ_OUT_OF_RANGE = "SEQ_OUT_OF_RANGE"
GATEWAY_LOST = "GATEWAY_LOST"

REASONS: dict[str, Reason] = {r.name: r for r in (
    Reason(INVALID_ARGUMENT, "INVALID_ARGUMENT",
           "a field of the request is malformed or out of bounds; metadata `field` names it when known"),
    Reason(NOT_FOUND, "NOT_FOUND",
           "what the request names does not exist — or belongs to another tenant, which is answered the same way"),
    Reason(ALREADY_EXISTS, "ALREADY_EXISTS", "what the request would create exists already"),
    Reason(FAILED_PRECONDITION, "FAILED_PRECONDITION",
           "the system is not in a state to do this now (the sentence says what to change)"),
    Reason(PERMISSION_DENIED, "PERMISSION_DENIED",
           "the caller is known but may not do this: a role it lacks, or a method not open to it; metadata `method`"),
    Reason(UNAUTHENTICATED, "UNAUTHENTICATED",
           "no credential, or one that is not accepted (expired, unknown, badly signed); metadata `method`"),
    Reason(RESOURCE_EXHAUSTED, "RESOURCE_EXHAUSTED", "a limit was reached (the sentence names it)"),
    Reason(SERVICE_UNAVAILABLE, "UNAVAILABLE", "a service on the way is not answering; retry with backoff"),
    Reason(DEADLINE_EXCEEDED, "DEADLINE_EXCEEDED", "the call ran out of time"),
    Reason(UNIMPLEMENTED, "UNIMPLEMENTED", "the method (or HTTP route and verb) is not served here"),
    Reason(CANCELLED, "CANCELLED", "the call was cancelled, by the caller or on its behalf"),
    Reason(INTERNAL_ERROR, "INTERNAL",
           "a fault of the service; metadata `trace_id` finds the details in its log and trace"),
    Reason(SESSION_BUSY, "FAILED_PRECONDITION",
           "the session is running a turn: a Chat with if_busy `reject`, or a DeleteSession or ClearTranscript "
           "meanwhile; metadata `session_id`. Wait, Cancel, or send with another if_busy"),
    Reason(QUOTA_EXCEEDED, "RESOURCE_EXHAUSTED",
           "a tenant's or a workspace's quota is used up; metadata `limit` names it "
           "(concurrent_turns, tokens_per_day, workspace_mb, workspace_quota)"),
    Reason(AGENTS_FROM_RESOURCES, "FAILED_PRECONDITION",
           "the namespace's agents (models) are defined by Kubernetes `Agent` (`ModelConfig`) resources "
           "(AGENTMESH_MANAGED_AGENT_NAMESPACES): change the resource, not the API; metadata `namespace`"),
    Reason(UNKNOWN_MODEL, "INVALID_ARGUMENT",
           "the model named is not one ListModels offers; metadata `field`, `model`"),
    Reason(UNKNOWN_TOOL, "INVALID_ARGUMENT",
           "a tool policy names a tool the catalog does not have; metadata `field`, `tool`"),
    Reason(UNKNOWN_SANDBOX_TEMPLATE, "INVALID_ARGUMENT",
           "a sandbox template the deployment does not define (agentmesh sandbox templates); metadata `field`, `template`"),
    Reason(APPROVAL_NOT_FOUND, "NOT_FOUND",
           "no tool call with that id waits for approval on the session (decided, timed out, or the turn ended); "
           "metadata `session_id`, `call_id`"),
    Reason(NOT_RUN_OWNER, "PERMISSION_DENIED",
           "a member decides the approvals of the runs they started only (an admin any); metadata `session_id`"),
    Reason(MALFORMED_REQUEST, "INVALID_ARGUMENT", "the request's bytes or body do not decode as the message expected"),
    Reason(REQUEST_TOO_LARGE, "INVALID_ARGUMENT",
           "the HTTP request body is larger than AGENTMESH_GATEWAY_HTTP_MAX_BODY_BYTES; metadata `limit_bytes`"),
    Reason(SHUTTING_DOWN, "UNAVAILABLE", "the gateway is draining; retry in a moment (another replica takes it)"),
    Reason(GATEWAY_LOST, "UNAVAILABLE",
           "a run's record (its `error_reason`): the gateway replica relaying it stopped without ending it (no "
           "word from it for AGENTMESH_GATEWAY_RUN_LEASE_S), and another replica recorded it `interrupted`"),
    Reason(TURN_TIMEOUT, "DEADLINE_EXCEEDED",
           "a turn ran longer than AGENTMESH_GATEWAY_TURN_TIMEOUT_S and was stopped (an `error` event); "
           "metadata `timeout_s`"),
    Reason(WATCHER_TOO_SLOW, "RESOURCE_EXHAUSTED",
           "a WatchActivity stream fell too far behind and was stopped; watch again"),
    Reason(BLOCK_FULL, "FAILED_PRECONDITION",
           "a memory block edit would pass its size limit (AGENTMESH_BLOCK_MAX_CHARS), or a namespace has as many blocks or waiting drafts as it may"),
    Reason(BLOCK_TEXT_NOT_FOUND, "FAILED_PRECONDITION",
           "a block_replace quotes text the block does not contain exactly once"),
    Reason(BLOCK_VERSION_NOT_FOUND, "NOT_FOUND",
           "RevertBlock names a version the block does not have"),
    Reason(BLOCK_DRAFT_NOT_FOUND, "NOT_FOUND",
           "no block draft with that id waits in the namespace (approved, rejected, or never)"),
    Reason(URL_REFUSED, "INVALID_ARGUMENT",
           "a URL the platform would call (a run's webhook) is not http(s), does not resolve, or reaches a "
           "loopback, link-local or private address the egress policy refuses; metadata `field`"),
    Reason(SEQ_OUT_OF_RANGE, "INVALID_ARGUMENT",
           "ForkSession names a message seq the session's transcript does not have (1 .. its message_count); "
           "metadata `at_seq`, `message_count`"),
)}

_DEFAULT_OF_CODE = {r.code: r.name for r in REASONS.values() if r.name in (
    INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, FAILED_PRECONDITION, PERMISSION_DENIED, UNAUTHENTICATED,
    RESOURCE_EXHAUSTED, SERVICE_UNAVAILABLE, DEADLINE_EXCEEDED, UNIMPLEMENTED, CANCELLED, INTERNAL_ERROR)}


def default_reason(code: str) -> str:
    """The generic reason of a status name ("NOT_FOUND" -> NOT_FOUND; INTERNAL_ERROR for a code
    agentmesh does not answer with, such as DATA_LOSS), for errors that arise where
    no reason was given (a peer's status without details, a status gRPC itself answered)."""
    return _DEFAULT_OF_CODE.get(code, INTERNAL_ERROR)
