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
flight gets a `sandbox_error` result at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

from agentmesh.logs import get_logger
from agentmesh.telemetry.genai import GEN_AI_TOOL_CALL_ID
from agentmesh.telemetry.propagation import traceparent_env
from agentmesh.tools.quota import UsageMeter, WorkspaceQuota
from agentmesh.tools.sandbox.base import CommandResult, CommandSpec, SandboxUnavailable
from agentmesh.tools.sandbox.jail_watch import JailInfo, JailWatch
from agentmesh.tools.sandbox.local import (
    INSTALL_HINT,
    LIMIT_SIGNALS,
    SANDBOX_PATH,
    LocalJail,
    apply_file_quota,
    apply_quota,
    clean_environment,
    jail_tmpfs,
)
from agentmesh.tools.sandbox.seccomp import filter_fd

log = get_logger("agentmesh.tools.sandbox.session")

SUPERVISOR_SOURCE = (Path(__file__).with_name("session_supervisor.py")).read_text()
# Mirrors session_supervisor.BOOT (that module is the jail's program, not imported here).
BOOT = ("import json, sys; SOURCE = json.loads(sys.stdin.buffer.readline()); "
        "exec(compile(SOURCE, 'session_supervisor', 'exec'), {'__name__': '__main__', 'SOURCE': SOURCE})")
# Processes of the jail that are not the calls': the supervisor and the Python interpreter.
SUPERVISOR_PROCESSES = 2
# After a timeout's SIGINT, how long the cell has to stop before the interpreter is ended.
INTERRUPT_GRACE_S = 2.0
# After a kill, how long the supervisor has to report the call's end.
KILL_GRACE_S = 2.0


class JailGone(Exception):
    """The session's jail ended while a call was in flight."""


@dataclasses.dataclass
class CellResult:
    result: CommandResult
    figures: list[str]
    interrupted: bool = False
    kernel_lost: bool = False


class SessionJail:
    """One session's running jail and its supervisor."""

    def __init__(self, session_id: str, workspace: Path, network: bool = False):
        self.session_id = session_id
        self.network = network
        self.workspace = workspace
        self.proc: asyncio.subprocess.Process | None = None
        self.info = JailInfo()
        self.watch: JailWatch | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._next_id = 0
        # The supervisor's id of each running exec call, by the call's own id (for `peek`).
        self.calls: dict[str, int] = {}
        self.in_flight = 0
        self.last_used = time.monotonic()
        self.ended = asyncio.Event()
        self.stderr = b""

    @property
    def alive(self) -> bool:
        return self.proc is not None and not self.ended.is_set()

    async def start(self, jail: LocalJail) -> None:
        loop = asyncio.get_running_loop()
        spec = CommandSpec(session_id=self.session_id, call_id="session", timeout_s=0,
                           argv=("python3", "-I", "-c", BOOT), network=self.network)
        seccomp_fd = filter_fd(jail.seccomp) if jail.seccomp else None
        options_fd = os.memfd_create("bwrap-options", os.MFD_CLOEXEC)
        try:
            command = jail.jail_argv(self.workspace, spec, self.info.write_fd, seccomp_fd, options_fd=options_fd,
                                     rlimits=False)
            command.write_options(options_fd)
            passed = [self.info.write_fd, options_fd] + ([seccomp_fd] if seccomp_fd is not None else [])
            self.proc = await asyncio.create_subprocess_exec(
                *command.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env={"PATH": SANDBOX_PATH, "LANG": "C.UTF-8"},
                cwd=str(self.workspace), start_new_session=True, pass_fds=passed,
                # A reply holds two capped streams, JSON-escaped (at most 6 bytes a byte): a
                # longer line is not the supervisor's, and ends the jail.
                limit=12 * jail.limits.output_cap_bytes + 2**16)
        finally:
            os.close(options_fd)
            if seccomp_fd is not None:
                os.close(seccomp_fd)
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(SUPERVISOR_SOURCE) + "\n").encode())
        loop.add_reader(self.info.read_fd, self.info.on_readable)
        limits = jail.limits
        # The memory and process bounds hold for the jail's whole life, the supervisor and the
        # interpreter counted in; the workspace quota is each exec call's (DiskWatch).
        self.watch = JailWatch(self.info, limits.memory_bytes, limits.processes + SUPERVISOR_PROCESSES,
                               tmpfs=jail_tmpfs(limits))
        self._watch_task = asyncio.create_task(self.watch.run())
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None and self.proc.stderr is not None
        errors = asyncio.create_task(self.proc.stderr.read(4096))
        try:
            while line := await self.proc.stdout.readline():
                message = json.loads(line)
                future = self._pending.pop(message.get("id"), None)
                if future is not None and not future.done():
                    future.set_result(message)
        except (ValueError, AttributeError, asyncio.LimitOverrunError) as exc:  # not JSON, not an object, too long
            log.warning("session sandbox sent an unreadable reply; ending it", session_id=self.session_id, error=str(exc))
        finally:
            await self.kill()
            with contextlib.suppress(Exception):
                self.stderr = await asyncio.wait_for(errors, 1)
            self.ended.set()
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(JailGone())
                    # Its caller may have stopped waiting (cancelled): the exception is then nobody's.
                    future.add_done_callback(lambda done: done.exception())
            self._pending.clear()

    def _send(self, message: dict[str, Any]) -> None:
        if not self.alive or self.proc is None or self.proc.stdin is None:
            raise JailGone()
        self.proc.stdin.write((json.dumps(message) + "\n").encode())

    def request(self, message: dict[str, Any]) -> tuple[int, asyncio.Future[dict[str, Any]]]:
        self._next_id += 1
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[self._next_id] = future
        try:
            self._send({**message, "id": self._next_id})
        except JailGone:
            self._pending.pop(self._next_id)
            raise
        return self._next_id, future

    def signal(self, op: str, call: int) -> None:
        with contextlib.suppress(JailGone, ConnectionError):
            self._send({"op": op, "id": call})

    async def kill(self) -> None:
        """End the jail: its init first (the kernel ends its PID namespace), then bwrap."""
        if self.proc is None:
            return
        if self.proc.returncode is None:
            await self.info.kill(self.proc.pid)
        if self._watch_task is not None:
            self._watch_task.cancel()
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(self.info.read_fd)

    async def close(self) -> None:
        await self.kill()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
        if self.proc is not None:
            await self.proc.wait()
        self.info.close()


class DiskWatch:
    """The workspace quota while one call runs, as a per-call jail's watch (jail_watch.JailWatch)
    keeps it: the workspace is measured every `JailWatch.DISK_INTERVAL_S` (or four times as long
    as a walk takes) and, when it grows past the quota, that call's process group is killed (a
    cell is interrupted) — not the jail: the writer is the call's."""

    def __init__(self, jail: SessionJail, call: int, quota: WorkspaceQuota, meter: UsageMeter, bytes_before: int,
                 files_before: int, stop: str = "kill"):
        self._jail, self._call, self._quota, self._meter, self._stop = jail, call, quota, meter, stop
        self._bytes_before, self._files_before = bytes_before, files_before
        self.exceeded = ""  # "disk_quota" | "file_quota"

    async def run(self) -> None:
        interval = JailWatch.DISK_INTERVAL_S
        while not self.exceeded:
            await asyncio.sleep(interval)
            started = time.monotonic()
            try:
                usage = await self._meter.measure(self._jail.workspace)
            except OSError:
                continue  # the workspace is being deleted, or a directory vanished mid-walk
            # Growth past the quota, not being past it: a call that starts over it may delete.
            if self._quota.over(usage.bytes) and usage.bytes > self._bytes_before:
                self.exceeded = "disk_quota"
            elif self._quota.files_over(usage.files) and usage.files > self._files_before:
                self.exceeded = "file_quota"
            else:
                interval = max(JailWatch.DISK_INTERVAL_S, 4 * (time.monotonic() - started))
                continue
            self._jail.signal(self._stop, self._call)


class SessionSandboxes:
    """Executor for AGENTMESH_SANDBOX_ISOLATION=session on the local jail."""

    name = "local-session"

    def __init__(self, jail: LocalJail, idle_s: float, network: bool = False):
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
                jail = SessionJail(session_id, self._jail.workspaces.ensure(session_id), self._network)
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
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except asyncio.CancelledError:
            jail.signal(stop, call)
            raise
        except TimeoutError:
            if grace_s:
                jail.signal(stop, call)
            raise

    async def _last_word(self, jail: SessionJail, call: int, future: asyncio.Future[dict[str, Any]],
                         stop: str) -> dict[str, Any]:
        """The reply of a call that was told to stop; when the supervisor does not give it within
        KILL_GRACE_S (a program stopped or took over the supervisor: it runs as the same user), the
        jail is ended, which answers every call in it."""
        try:
            return await self._await(jail, call, future, KILL_GRACE_S, stop, 0)
        except TimeoutError:
            log.warning("session sandbox did not answer a stopped call; ending it", session_id=jail.session_id)
            await jail.kill()
            return {"exit_code": -9, "stdout": "", "stderr": "", "truncated": False, "kernel_lost": True}

    def _exec_result(self, reply: dict[str, Any], spec: CommandSpec, timed_out: bool, started: float) -> CommandResult:
        # The supervisor shares the jail with the programs (they may have replaced it): every field
        # is checked for its type, and a missing or odd one reads as nothing.
        def field(name: str, kind: type, default: Any) -> Any:
            value = reply.get(name, default)
            return value if type(value) is kind else default  # exactly: a bool is an int too

        result = CommandResult(exit_code=field("exit_code", int, -1), stdout=field("stdout", str, ""),
                               stderr=field("stderr", str, ""), truncated=field("truncated", bool, False),
                               duration_ms=(time.monotonic() - started) * 1000)
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
            timed_out = False
            try:
                reply = await self._await(jail, call, future, spec.timeout_s, "interrupt", INTERRUPT_GRACE_S)
            except TimeoutError:
                timed_out = True
                try:
                    reply = await self._await(jail, call, future, INTERRUPT_GRACE_S, "interrupt", 0)
                except TimeoutError:
                    # The cell did not give way to KeyboardInterrupt (a C extension's loop): the
                    # interpreter is ended, which answers the cell.
                    jail.signal("restart", 0)
                    reply = await self._last_word(jail, call, future, "restart")
            finally:
                watch.cancel()
            timed_out = timed_out and not disk.exceeded
            result = self._exec_result(reply, spec, timed_out, started)
            after = await self._meter.measure(jail.workspace)
            lowered = file_size < self._limits.file_size_bytes
            apply_quota(result, self._quota, before.bytes, after.bytes, lowered, stopped=disk.exceeded == "disk_quota")
            apply_file_quota(result, self._quota, before.files, after.files, stopped=disk.exceeded == "file_quota")
            if result.error_kind == "disk_quota":
                pass  # said by apply_quota; the interpreter keeps its variables
            elif timed_out:
                result.detail = (f"the cell ran past its {spec.timeout_s:g} s time limit and was interrupted"
                                 + ("; the interpreter had to be restarted, so its variables are gone"
                                    if reply.get("kernel_lost") else "; the interpreter keeps its variables"))
            elif reply.get("cpu_limit"):
                result.error_kind = "cpu_limit"
                result.detail = ("the cell was stopped by the sandbox's CPU time limit; the interpreter keeps "
                                 "its variables")
            elif reply.get("kernel_lost"):
                result.error_kind = result.error_kind or "kernel_lost"
                result.detail = result.detail or ("the Python interpreter ended during the cell (a limit or a crash); "
                                                  "its variables are gone and the next call starts a fresh one")
            figures = reply.get("figures")
            figures = [f for f in figures if isinstance(f, str)] if isinstance(figures, list) else []
            return CellResult(result, figures, bool(reply.get("interrupted")),
                              bool(reply.get("kernel_lost")))
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
                        self._starting.pop(session_id, None)

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        for session_id in list(self._jails):
            await self.end_session(session_id)
        self._meter.close()
        await self._jail.close()
