"""Session sandboxes (AGENTMESH_SANDBOX_ISOLATION=session): one long-lived bubblewrap jail per
session, each call a fresh process inside it.

The jail is built exactly as a per-call one (`LocalJail.jail_argv`: the same namespaces, seccomp
filter, rlimits, read-only system, bounded tmpfs, no network, clean environment); its program is
the supervisor (session_supervisor.py) under the system Python. The service talks to it over the
jail's stdin and stdout — pipes, so nothing is bound into the jail for it and no other session
can reach it. Each call sends a request and awaits the reply with its own id; a call's timeout,
output cap and cancellation act on that call's process group only. The `python` tool's cells run
in one persistent interpreter of the jail (the supervisor's kernel); a timeout interrupts the cell
(SIGINT) and keeps the interpreter.

A jail with no call in flight for `idle_s` is ended (its /tmp, processes and Python state go);
the next call starts a new one on the same workspace. Deleting the workspace ends it. When the
jail dies (its watch stops it, a program kills the supervisor, the host kills it), every call in
flight gets an error result at once (`sandbox_error`, or `oom` / `process_limit` from its watch).
The jail itself and its pipe are session_jail.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Awaitable, Callable

from agentmesh.logs import get_logger
from agentmesh.telemetry.genai import GEN_AI_TOOL_CALL_ID
from agentmesh.telemetry.propagation import traceparent_env
from agentmesh.tools.quota import UsageMeter
from agentmesh.tools.sandbox.base import CellResult, CommandResult, CommandSpec, SandboxUnavailable
from agentmesh.tools.sandbox.local import (
    INSTALL_HINT,
    LIMIT_SIGNALS,
    LocalJail,
    clean_environment,
)
from agentmesh.tools.sandbox.quota_results import apply_file_quota, apply_quota
from agentmesh.tools.sandbox.session_jail import DiskWatch, SessionJail
from agentmesh.tools.sandbox.supervisor_link import (
    KILL_GRACE_S,
    JailGone,
    cell_details,
    cell_reply,
    last_word,
    reply_result,
)

log = get_logger("agentmesh.tools.sandbox.session")


class SessionSandboxes:
    """Executor for AGENTMESH_SANDBOX_ISOLATION=session on the local jail."""

    name = "local-session"

    def __init__(self, jail: LocalJail, idle_s: float, network: bool = False, egress: bool = False):
        self._egress = egress  # a template with network: egress: the jail gets a user-mode network (egress.py)
        self._jail = jail
        self._network = network  # AGENTMESH_SANDBOX_NETWORK: the whole jail has the host's network or none
        self._limits = jail.limits
        self._quota = jail.quota
        self._idle_s = idle_s
        self._meter = UsageMeter()
        self._jails: dict[str, SessionJail] = {}
        self._starting: dict[str, asyncio.Lock] = {}
        self._reaper: asyncio.Task[None] | None = None

    @property
    def available(self) -> bool:
        return self._jail.available

    @property
    def jail(self) -> LocalJail:
        """The per-call jail session sandboxes are built like (stdio MCP servers still use it)."""
        return self._jail

    def running(self, session_id: str) -> SessionJail | None:
        jail = self._jails.get(session_id)
        return jail if jail is not None and jail.alive else None

    async def _session(self, session_id: str) -> SessionJail:
        if not self._jail.available:
            raise SandboxUnavailable(INSTALL_HINT.format(path=self._jail.bwrap_path))
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.create_task(self._reap())
        async with self._starting.setdefault(session_id, asyncio.Lock()):
            jail = self.running(session_id)
            if jail is None:
                old = self._jails.pop(session_id, None)
                if old is not None:
                    await old.close()
                jail = SessionJail(session_id, self._jail.workspaces.ensure(session_id), self._network, self._egress)
                await jail.start(self._jail)
                self._jails[session_id] = jail
                log.info("session sandbox started", session_id=session_id)
            jail.in_flight += 1
            return jail

    def _rlimits(self, file_size: int, *, cpu: bool) -> dict[str, int]:
        """The per-call jail's rlimits (local.rlimit_prefix), for the supervisor to set on each
        process it starts: CPU seconds, address space, processes, file size (lowered to what the
        workspace quota leaves). The interpreter lives across cells, so its CPU limit is set per
        cell instead (`cpu=False`; session_supervisor.Kernel)."""
        limits = {"as": self._limits.memory_bytes, "nproc": self._limits.processes, "fsize": file_size}
        return {**limits, "cpu": self._limits.cpu_s} if cpu else limits

    def _done(self, jail: SessionJail) -> None:
        jail.in_flight -= 1
        jail.last_used = time.monotonic()

    def _span(self, spec: CommandSpec, kind: str) -> Any:
        """The call's span (its TRACEPARENT is what the program gets), as a per-call jail's `sandbox.jail`."""
        return self._jail.tracer.start_as_current_span("sandbox.session", attributes={
            "agentmesh.sandbox.executor": "local-session", "agentmesh.session_id": spec.session_id,
            GEN_AI_TOOL_CALL_ID: spec.call_id, "agentmesh.sandbox.kind": kind,
            "agentmesh.sandbox.timeout_s": spec.timeout_s})

    async def run(self, spec: CommandSpec) -> CommandResult:
        with self._span(spec, "exec") as span:
            result = await self._run(spec)
            span.set_attribute("agentmesh.sandbox.exit_code", result.exit_code)
            if result.error_kind:
                span.set_attribute("agentmesh.sandbox.error_kind", result.error_kind)
            return result

    async def _run(self, spec: CommandSpec) -> CommandResult:
        jail = await self._session(spec.session_id)
        started = time.monotonic()
        try:
            before = await self._meter.measure(jail.workspace)
            file_size = min(self._limits.file_size_bytes, self._quota.remaining(before.bytes))
            env = clean_environment({**spec.env, **traceparent_env()})
            call, future = jail.request({"op": "exec", "argv": list(spec.argv), "env": env,
                                         "limits": self._rlimits(file_size, cpu=True),
                                         "fsize_max": self._limits.file_size_bytes,
                                         "cap": self._limits.output_cap_bytes, "drain": self._limits.output_drain_bytes})
            jail.calls[spec.call_id] = call
            disk = DiskWatch(jail, call, self._quota, self._meter, before.bytes, before.files)
            watch = asyncio.create_task(disk.run())
            timed_out = False
            try:
                reply = await self._await(jail, call, future, spec.timeout_s, "kill", KILL_GRACE_S)
            except TimeoutError:
                timed_out = True
                reply = await self._last_word(jail, call, future, "kill")
            finally:
                jail.calls.pop(spec.call_id, None)
                watch.cancel()
            result = self._exec_result(reply, spec, timed_out and not disk.exceeded, started)
            after = await self._meter.measure(jail.workspace)
            lowered = file_size < self._limits.file_size_bytes
            apply_quota(result, self._quota, before.bytes, after.bytes, lowered, stopped=disk.exceeded == "disk_quota")
            apply_file_quota(result, self._quota, before.files, after.files, stopped=disk.exceeded == "file_quota")
            return result
        except JailGone:
            return self._gone(jail, started)
        finally:
            self._done(jail)

    async def _await(self, jail: SessionJail, call: int, future: asyncio.Future[dict[str, Any]], timeout_s: float,
                     stop: str, grace_s: float) -> dict[str, Any]:
        """The reply of `call`; on timeout or cancellation the call is stopped (`stop`) first."""
        return await jail.link.reply(call, future, timeout_s, stop, grace_s)

    async def _last_word(self, jail: SessionJail, call: int, future: asyncio.Future[dict[str, Any]],
                         stop: str) -> dict[str, Any]:
        return await last_word(jail.link, call, future, stop, _ender(jail))

    def _exec_result(self, reply: dict[str, Any], spec: CommandSpec, timed_out: bool, started: float) -> CommandResult:
        result = reply_result(reply, started)
        signal_no = result.exit_code - 128 if result.exit_code > 128 else 0
        if timed_out:
            result.exit_code, result.error_kind = -9, "timeout"
            result.detail = (f"the command ran past its {spec.timeout_s:g} s time limit and was stopped "
                             + ("(the session sandbox did not answer, so it was ended; the workspace stays)"
                                if reply.get("kernel_lost") else
                                "(its process group was killed; the session sandbox stays)"))
        elif reply.get("output_limit"):
            result.exit_code, result.error_kind = -9, "output_limit"
            result.detail = (f"the command wrote more than {self._limits.output_drain_bytes} bytes of output and was "
                             "stopped; redirect large output to a file in the workspace and read parts of it")
        elif signal_no in LIMIT_SIGNALS:
            result.error_kind, what = LIMIT_SIGNALS[signal_no]
            result.detail = f"the command was stopped by the sandbox's {what}"
        return result

    def _gone(self, jail: SessionJail, started: float) -> CommandResult:
        exceeded = jail.watch.exceeded if jail.watch is not None else ""
        if exceeded == "memory":
            kind, detail = "oom", (f"the session sandbox's processes together used more than "
                                   f"{self._limits.memory_bytes // 2**20} MiB of memory and it was stopped")
        elif exceeded == "processes":
            kind, detail = "process_limit", (f"the session sandbox ran more than {self._limits.processes} processes "
                                             "at once and was stopped")
        else:
            said = jail.stderr.decode(errors="replace").strip()
            kind, detail = "sandbox_error", ("the session sandbox ended while the call ran (its processes and Python "
                                             "state are gone; the workspace stays; the next call starts a new one)"
                                             + (f": {said}" if said else ""))
        return CommandResult(exit_code=-9, stdout="", stderr="", error_kind=kind, detail=detail,
                             duration_ms=(time.monotonic() - started) * 1000)

    async def run_cell(self, spec: CommandSpec, code: str) -> CellResult:
        """Run `code` in the session's persistent interpreter."""
        with self._span(spec, "cell") as span:
            cell = await self._run_cell(spec, code)
            if cell.result.error_kind:
                span.set_attribute("agentmesh.sandbox.error_kind", cell.result.error_kind)
            return cell

    async def _run_cell(self, spec: CommandSpec, code: str) -> CellResult:
        jail = await self._session(spec.session_id)
        started = time.monotonic()
        try:
            before = await self._meter.measure(jail.workspace)
            file_size = min(self._limits.file_size_bytes, self._quota.remaining(before.bytes))
            env = clean_environment({**spec.env, **traceparent_env()})
            call, future = jail.request({"op": "cell", "code": code, "env": env, "cap": self._limits.output_cap_bytes,
                                         "limits": self._rlimits(self._limits.file_size_bytes, cpu=False),
                                         "cpu_s": self._limits.cpu_s, "fsize": file_size})
            disk = DiskWatch(jail, call, self._quota, self._meter, before.bytes, before.files, stop="interrupt")
            watch = asyncio.create_task(disk.run())
            try:
                reply, timed_out = await cell_reply(jail.link, call, future, spec.timeout_s, _ender(jail))
            finally:
                watch.cancel()
            timed_out = timed_out and not disk.exceeded
            result = self._exec_result(reply, spec, timed_out, started)
            after = await self._meter.measure(jail.workspace)
            lowered = file_size < self._limits.file_size_bytes
            apply_quota(result, self._quota, before.bytes, after.bytes, lowered, stopped=disk.exceeded == "disk_quota")
            apply_file_quota(result, self._quota, before.files, after.files, stopped=disk.exceeded == "file_quota")
            return cell_details(result, reply, spec, timed_out)
        except JailGone:
            return CellResult(self._gone(jail, started), [], kernel_lost=True)
        finally:
            self._done(jail)

    async def peek(self, session_id: str, call_id: str) -> tuple[str, str] | None:
        """(stdout, stderr) so far of a call still running in the session's jail (a background
        command), or None when it is not running there."""
        jail = self.running(session_id)
        call = jail.calls.get(call_id) if jail is not None else None
        if jail is None or call is None:
            return None
        try:
            _, future = jail.request({"op": "peek", "call": call})
            reply = await asyncio.wait_for(future, KILL_GRACE_S)
        except (JailGone, TimeoutError):
            return None
        return (reply["stdout"], reply["stderr"]) if reply.get("running") else None

    async def restart_kernel(self, session_id: str) -> None:
        jail = self.running(session_id)
        if jail is None:
            return  # no interpreter to clear: the next cell starts a fresh one anyway
        with contextlib.suppress(JailGone, TimeoutError):
            _, future = jail.request({"op": "restart"})
            await asyncio.wait_for(future, KILL_GRACE_S)

    async def end_session(self, session_id: str) -> None:
        """End the session's jail (its workspace is being deleted, or it idled)."""
        jail = self._jails.pop(session_id, None)
        lock = self._starting.get(session_id)
        if lock is not None and not lock.locked():
            del self._starting[session_id]  # a session that is gone keeps no lock here
        if jail is not None:
            await jail.close()
            log.info("session sandbox ended", session_id=session_id)

    async def _reap(self) -> None:
        interval = max(min(self._idle_s / 4, 10.0), 0.05)
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for session_id, jail in list(self._jails.items()):
                if not jail.alive or (jail.in_flight == 0 and now - jail.last_used >= self._idle_s):
                    lock = self._starting.get(session_id)
                    if lock is not None and lock.locked():
                        continue
                    if self._jails.get(session_id) is jail and jail.in_flight == 0:
                        await self.end_session(session_id)

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        for session_id in list(self._jails):
            await self.end_session(session_id)
        self._meter.close()
        await self._jail.close()


def _ender(jail: SessionJail) -> Callable[[], Awaitable[None]]:
    """How a jail whose supervisor does not answer a stopped call is ended."""
    async def end() -> None:
        log.warning("session sandbox did not answer a stopped call; ending it", session_id=jail.session_id)
        await jail.kill()

    return end
