"""Watching a running jail from outside: bwrap's report of its init process, and the watch that
kills the whole jail when its processes together, or its workspace, pass their limits."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections.abc import Mapping
from pathlib import Path

from agentmesh.tools.quota import UsageMeter, WorkspaceQuota
from agentmesh.tools.sandbox.process import kill_group


class JailInfo:
    """bwrap's `--info-fd` report, for killing a jail from the inside out.

    Killing bwrap's own process first would rely on the jail's `--die-with-parent`, which bwrap
    arms only some way into setting the jail up; a jail cancelled in that window would run on.
    The PID of the jail's init (from the report, written right after bwrap clones it) is killed
    first instead — the kernel then ends everything in its PID namespace — and bwrap after it.
    """

    CHILD_PID = re.compile(rb'"child-pid"\s*:\s*(\d+)')

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        self._report = b""
        self.child_pid: int | None = None
        self.reported_at: float | None = None

    def on_readable(self) -> None:
        self._poll()
        if self.child_pid is not None and self.reported_at is None:
            self.reported_at = time.monotonic()

    def _poll(self) -> None:
        try:
            while chunk := os.read(self.read_fd, 4096):
                self._report += chunk
        except (BlockingIOError, OSError):
            pass
        match = self.CHILD_PID.search(self._report)
        if match:
            self.child_pid = int(match.group(1))

    async def kill(self, pid: int) -> None:
        self._poll()
        if self.child_pid is None and _alive(pid):
            # bwrap has not cloned the jail yet or not reported it; it does so within moments.
            for _ in range(100):
                await asyncio.sleep(0.01)
                self._poll()
                if self.child_pid is not None or not _alive(pid):
                    break
        init = _open_pidfd(self.child_pid) if self.child_pid is not None else None
        if self.child_pid is not None:
            try:
                os.kill(self.child_pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        kill_group(pid)
        if init is not None:
            await _ended(init)

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            try:
                os.close(fd)
            except OSError:
                pass


class JailWatch:
    """Bounds the jail as a whole: its processes' resident memory and number, and its workspace's disk.

    RLIMIT_AS bounds each process alone, so 128 processes could each take the limit; and when the
    jail has to run as root's uid (see `local.jail_host_identity`) the kernel does not enforce
    RLIMIT_NPROC at all. Without a cgroup of our own (not available to an unprivileged service
    everywhere) the jail's process tree is read from /proc ten times a second, and the jail is
    killed when it passes either limit.

    RLIMIT_FSIZE likewise bounds each file alone: eight files just under it add up to eight times
    it. Without root there is no per-directory quota to ask the kernel for (project quotas, a loop
    mount), so the workspace is measured (`quota.workspace_usage`, on the meter's threads) every
    `DISK_INTERVAL_S` — or four times as long as a walk takes, for a workspace of very many files —
    and the jail is killed when it grows past its quota. A writer overshoots by what it can
    write in one interval plus one walk (see docs/tools.md for measured numbers).
    """

    INTERVAL_S = 0.1
    DISK_INTERVAL_S = 0.05
    PAGE = os.sysconf("SC_PAGE_SIZE")

    def __init__(
        self,
        info: JailInfo,
        memory_bytes: int,
        processes: int,
        workspace: Path | None = None,
        quota: WorkspaceQuota | None = None,
        disk_baseline: int = 0,
        files_baseline: int = 0,
        meter: UsageMeter | None = None,
        tmpfs: Mapping[str, int] | None = None,
    ):
        self._info = info
        self._tmpfs = dict(tmpfs or {})  # the jail's in-memory file systems: path -> size
        self._memory = memory_bytes
        self._processes = processes
        self._workspace = workspace
        self._quota = quota
        self.exceeded = ""  # "memory" | "processes" | "disk_quota" | "file_quota"
        self.disk_usage = 0  # the workspace's size when the disk watch last looked
        self._disk_baseline = disk_baseline  # its size when the call began
        self._files_baseline = files_baseline  # and its files
        self._meter = meter

    async def run(self) -> None:
        watches = [self._watch_processes()]
        if self._workspace is not None and self._quota is not None and self._meter is not None:
            watches.append(self._watch_disk(self._workspace, self._quota, self._meter))
        await asyncio.gather(*watches)

    async def _watch_processes(self) -> None:
        while not self.exceeded:
            await asyncio.sleep(self.INTERVAL_S)
            init = self._info.child_pid
            if init is None:
                continue
            count, used = process_tree(init, self.PAGE, self._processes + 2)
            used += tmpfs_usage(init, self._tmpfs)
            # The jail's init (bwrap) is not the program's; allow for it.
            if count > self._processes + 1:
                self._stop("processes")
            elif used > self._memory:
                self._stop("memory")

    async def _watch_disk(self, workspace: Path, quota: WorkspaceQuota, meter: UsageMeter) -> None:
        interval = self.DISK_INTERVAL_S
        while not self.exceeded:
            await asyncio.sleep(interval)
            if self._info.child_pid is None:
                continue
            started = time.monotonic()
            try:
                usage = await meter.measure(workspace)
            except OSError:
                continue  # the workspace was deleted under the call, or a directory vanished mid-walk
            self.disk_usage = usage.bytes
            # Growth past the quota, not being past it: a call that starts over it may delete.
            if quota.over(usage.bytes) and usage.bytes > self._disk_baseline:
                self._stop("disk_quota")
            elif quota.files_over(usage.files) and usage.files > self._files_baseline:
                self._stop("file_quota")
            interval = max(self.DISK_INTERVAL_S, 4 * (time.monotonic() - started))

    def _stop(self, reason: str) -> None:
        if self.exceeded:
            return
        self.exceeded = reason
        init = self._info.child_pid
        if init is None:
            return
        try:
            os.kill(init, signal.SIGKILL)  # the jail's init: its whole PID namespace goes
        except (ProcessLookupError, PermissionError):
            pass


def process_tree(root: int, page: int, max_count: int) -> tuple[int, int]:
    """(processes, resident bytes) of `root` and its descendants; counting stops past `max_count`."""
    total, pending, seen = 0, [root], set[int]()
    while pending and len(seen) <= max_count:
        pid = pending.pop()
        if pid in seen:
            continue
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
            seen.add(pid)
            for task in os.listdir(f"/proc/{pid}/task"):
                pending.extend(int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split())
        except (OSError, ValueError, IndexError):
            continue
    return len(seen), total


def tmpfs_usage(init: int, mounts: Mapping[str, int]) -> int:
    """Bytes the jail's in-memory file systems (path -> the size it was given) hold, seen through
    its init's root (the kernel lets the jail's owner look). Until bwrap has built the jail, that
    root is still the host's — whose /tmp holds gigabytes — so nothing counts while it is, and only
    a file system of exactly the size given counts; one that cannot be looked at (the jail is
    ending) counts 0."""
    try:
        root, ours = os.stat(f"/proc/{init}/root"), os.stat("/")
    except OSError:
        return 0
    if (root.st_dev, root.st_ino) == (ours.st_dev, ours.st_ino):
        return 0
    total = 0
    for mount, size in mounts.items():
        try:
            info = os.statvfs(f"/proc/{init}/root{mount}")
        except OSError:
            continue
        if info.f_blocks * info.f_frsize != -(-size // info.f_frsize) * info.f_frsize:
            continue  # not (yet) the jail's own
        total += (info.f_blocks - info.f_bfree) * info.f_frsize
    return total


def _open_pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except OSError:  # gone already, or a kernel without pidfds
        return None


async def _ended(pidfd: int, deadline_s: float = 10.0) -> None:
    """Waits until the jail's init has exited. The kernel kills the rest of its PID namespace on
    the way and lets the init exit only once every other process there is gone, so after this no
    process of the jail runs on — without it, a call could answer "stopped" while the kernel was
    still ending its processes, which on a busy machine takes a while."""
    loop = asyncio.get_running_loop()
    ended: asyncio.Future[None] = loop.create_future()

    def on_exit() -> None:
        if not ended.done():
            ended.set_result(None)

    loop.add_reader(pidfd, on_exit)
    try:
        await asyncio.wait_for(ended, deadline_s)
    except TimeoutError:
        pass  # a process stuck in the kernel; the call answers anyway, the kernel ends it later
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
