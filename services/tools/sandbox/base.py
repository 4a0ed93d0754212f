"""The one interface every executor implements: run a command for a session, return what happened."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, runtime_checkable

__all__ = ["CellResult", "CommandResult", "CommandSpec", "Executor", "NoMetrics", "SandboxMetrics", "SandboxUnavailable",
           "SessionKernel"]


@dataclass(frozen=True)
class CommandSpec:
    """One program to run in a fresh sandbox with the session's workspace as its working directory."""

    session_id: str
    call_id: str
    argv: tuple[str, ...]
    timeout_s: float
    # Network for this call; off unless the call's policy allows it.
    network: bool = False
    # The call's template allows egress (templates.py): the internet only, never the host or
    # private ranges — the local jail gives it a user-mode network (egress.py) instead of the
    # host's; a pod is labelled for the chart's egress NetworkPolicy as with `network`.
    egress: bool = False
    # Extra environment (only TRACEPARENT today); everything else is a fixed clean set.
    env: Mapping[str, str] = field(default_factory=dict)
    # Who owns the session (its tenant, "" without tenancy; its namespace): labels on what a
    # cluster's sandbox backend creates for it (agent_sandbox.py's SandboxClaims).
    tenant: str = ""
    namespace: str = ""


@dataclass
class CommandResult:
    exit_code: int
    stdout: str
    stderr: str
    truncated: bool = False
    duration_ms: float = 0.0
    # "" when the program ran to its own end; else why it did not, e.g. "timeout", "oom",
    # "output_limit", "cpu_limit", "file_size_limit", "disk_quota", "image_pull", "unschedulable", "sandbox_error".
    error_kind: str = ""
    # A sentence for a person (and the model) when error_kind is set.
    detail: str = ""
    # Structured facts about the failure for clients (e.g. quota_bytes, usage_bytes for disk_quota).
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class CellResult:
    """A cell of the `python` tool's persistent interpreter (session sandboxes)."""

    result: CommandResult
    figures: list[str]
    interrupted: bool = False
    kernel_lost: bool = False
    tables: list[str] = field(default_factory=list)  # CSV files of the tables it showed


class Executor(Protocol):
    """Runs commands in isolation. Cancelling `run` must stop the program at once and clean up."""

    name: str

    async def run(self, spec: CommandSpec) -> CommandResult: ...

    async def close(self) -> None: ...


@runtime_checkable
class SessionKernel(Protocol):
    """An executor of session sandboxes (a local jail or a cluster pod per session): the `python`
    tool's cells run in the session's persistent interpreter, and a background command's output
    can be read while it runs."""

    async def run_cell(self, spec: CommandSpec, code: str) -> CellResult: ...

    async def restart_kernel(self, session_id: str) -> None: ...

    async def peek(self, session_id: str, call_id: str) -> tuple[str, str] | None: ...


class SandboxMetrics(Protocol):
    """Where executors report how long a call waited for its sandbox (agentmesh.sandbox.wait)."""

    def record_sandbox_wait(self, seconds: float, executor: str) -> None: ...


class NoMetrics:
    def record_sandbox_wait(self, seconds: float, executor: str) -> None:
        return None


class SandboxUnavailable(Exception):
    """The executor cannot isolate anything on this machine (e.g. no bwrap); the message says how to fix it."""
