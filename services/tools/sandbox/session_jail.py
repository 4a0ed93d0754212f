"""One session sandbox's jail (session.py): bwrap running the supervisor (session_supervisor.py),
the JSON-lines pipe to it (its protocol: supervisor_link.py), and the watch of one call's
workspace quota."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from agentmesh.logs import get_logger
from agentmesh.tools.quota import UsageMeter, WorkspaceQuota
from agentmesh.tools.sandbox.base import CommandSpec, SandboxUnavailable
from agentmesh.tools.sandbox.egress import EgressUnavailable, UserNetwork, attach_network
from agentmesh.tools.sandbox.jail_watch import JailInfo, JailWatch
from agentmesh.tools.sandbox.local import SANDBOX_PATH, LocalJail, jail_tmpfs
from agentmesh.tools.sandbox.seccomp import filter_fd
from agentmesh.tools.sandbox.supervisor_link import BOOT, SUPERVISOR_SOURCE, JailGone, SupervisorLink

log = get_logger("agentmesh.tools.sandbox.session")

# Processes of the jail that are not the calls': the supervisor, the Python interpreter, the
# spawner and, while its last calls end, the spawner it replaced (session_spawner.Spawner).
SUPERVISOR_PROCESSES = 4


class SessionJail:
    """One session's running jail and its supervisor."""

    def __init__(self, session_id: str, workspace: Path, network: bool = False, egress: bool = False):
        self.session_id = session_id
        self.network = network
        self.egress = egress
        self.user_network: UserNetwork | None = None
        self.workspace = workspace
        self.proc: asyncio.subprocess.Process | None = None
        self.info = JailInfo()
        self.watch: JailWatch | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self.link = SupervisorLink(self._write)
        # The supervisor's id of each running exec call, by the call's own id (for `peek`).
        self.calls: dict[str, int] = {}
        self.in_flight = 0
        self.last_used = time.monotonic()
        self.ended = self.link.ended
        self.killed = False
        self.stderr = b""

    @property
    def alive(self) -> bool:
        # Killed counts at once: the link sees its end only when the reader next runs, and a call
        # sent meanwhile would go to the dying jail instead of a new one.
        return self.proc is not None and not self.killed and not self.ended.is_set()

    async def start(self, jail: LocalJail) -> None:
        loop = asyncio.get_running_loop()
        spec = CommandSpec(session_id=self.session_id, call_id="session", timeout_s=0,
                           argv=("python3", "-I", "-c", BOOT), network=self.network or self.egress, egress=self.egress)
        if self.egress:
            try:
                self.user_network = UserNetwork(allowed=jail.egress_allow)
            except EgressUnavailable as exc:
                raise SandboxUnavailable(str(exc)) from None
        seccomp_fd = filter_fd(jail.seccomp) if jail.seccomp else None
        options_fd = os.memfd_create("bwrap-options", os.MFD_CLOEXEC)
        try:
            command = jail.jail_argv(self.workspace, spec, self.info.write_fd, seccomp_fd, options_fd=options_fd,
                                     rlimits=False,
                                     block_fd=self.user_network.block_fd if self.user_network else None)
            command.write_options(options_fd)
            passed = [self.info.write_fd, options_fd] + ([seccomp_fd] if seccomp_fd is not None else [])
            if self.user_network is not None:
                passed.append(self.user_network.block_fd)
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
        if self.user_network is not None:
            # The supervisor starts once the network is set up; a jail whose network could not
            # be is killed before it runs anything, and the call says why.
            await attach_network(self.user_network, self.info)
            if self.user_network.failure:
                await self.kill()
                raise SandboxUnavailable(self.user_network.failure)
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
                self.link.receive(line)
        except (ValueError, AttributeError, asyncio.LimitOverrunError) as exc:  # not JSON, not an object, too long
            log.warning("session sandbox sent an unreadable reply; ending it", session_id=self.session_id, error=str(exc))
        finally:
            await self.kill()
            with contextlib.suppress(Exception):
                self.stderr = await asyncio.wait_for(errors, 1)
            self.link.end()

    def _write(self, line: bytes) -> None:
        if self.proc is None or self.proc.stdin is None:
            raise JailGone()
        self.proc.stdin.write(line)

    def request(self, message: dict[str, Any]) -> tuple[int, asyncio.Future[dict[str, Any]]]:
        return self.link.request(message)

    def signal(self, op: str, call: int) -> None:
        self.link.signal(op, call)

    async def kill(self) -> None:
        """End the jail: its init first (the kernel ends its PID namespace), then bwrap."""
        if self.proc is None:
            return
        self.killed = True
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
        if self.user_network is not None:
            await self.user_network.close()
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
