"""Per-session workspace quotas: how much disk a workspace uses, and what a write may still add.

Usage is what the workspace holds on disk: allocated blocks (`st_blocks`, so a sparse file counts
what it really takes), of every file, directory and symlink under it, each inode once (hard links
share one). The walk goes through directory descriptors with O_NOFOLLOW, like `beneath.py`: a
directory swapped for a symlink mid-walk is not entered, so a program cannot make us measure (or
touch) anything outside its workspace.

A program may hide a directory from the walk by taking away its read or search permission (mode
0333 still lets it write there by name). The service owns the files of its workspaces (the jail's
user maps to the service's uid; a root service reads everything anyway), so the walk gives such a
directory back `u+rx` and measures it.
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentmesh.tools.results import ToolFailure

MIB = 1024 * 1024
_REOPEN_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_PATH_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OWNER_RX = stat.S_IRUSR | stat.S_IXUSR


def mib(size: int) -> str:
    """A size for a sentence: `12.5 MiB`."""
    return f"{size / MIB:.1f} MiB"


class TooManyEntries(Exception):
    """The walk met more entries than it was allowed to look at."""


@dataclass(frozen=True)
class Usage:
    """What a workspace holds: bytes on disk, and files (inodes: files, directories, symlinks;
    hard links once; the workspace itself not counted)."""

    bytes: int = 0
    files: int = 0

    def grew_from(self, before: Usage) -> bool:
        return self.bytes > before.bytes or self.files > before.files


def workspace_usage(workspace: Path, max_entries: int | None = None) -> int:
    """Bytes the workspace takes on disk (0 if it does not exist). With `max_entries`, raises
    TooManyEntries rather than look at more entries than that."""
    return measure_workspace(workspace, max_entries).bytes


def measure_workspace(workspace: Path, max_entries: int | None = None) -> Usage:
    """The workspace's bytes and files, in one walk (an empty Usage if it does not exist)."""
    try:
        top = os.open(workspace, _PATH_FLAGS)
    except FileNotFoundError:
        return Usage()
    walk = _Walk(max_entries)
    size = walk.run(top)
    return Usage(size, walk.files)


class _Walk:
    """Depth first, without recursion (a program may nest directories thousands deep).

    One O_PATH descriptor is held per level down to `HELD_LEVELS`, so the walk's descriptors stay
    bounded. Below that only the current directory's is held; going back up opens `..` and checks
    it is the directory recorded on the way down (device and inode), else — a program moved the
    tree meanwhile — reaches it again from the deepest held level by its names, each step with
    O_NOFOLLOW. Either way the walk stays linear in the size of the tree.
    """

    HELD_LEVELS = 64

    def __init__(self, max_entries: int | None = None) -> None:
        self.total = 0
        self.files = -1  # the top directory is the workspace itself, not one of its files
        self._seen: set[tuple[int, int]] = set()
        self._budget = max_entries

    def run(self, top: int) -> int:
        # Per level: [held descriptor or -1, name, names inside not yet visited, st_dev, st_ino].
        stack: list[list[Any]] = []
        cur = top  # the deepest level's directory; ours to close when that level holds none
        try:
            info, names = self._enter(top)
            stack.append([top, "", names, info.st_dev, info.st_ino])
            while stack:
                level = stack[-1]
                if not level[2]:
                    cur = self._leave(stack, cur)
                    continue
                name = level[2].pop()
                try:
                    entry = os.stat(name, dir_fd=cur, follow_symlinks=False)
                except OSError:
                    continue  # gone meanwhile
                if stat.S_ISDIR(entry.st_mode):
                    cur = self._descend(stack, cur, name)
                    continue
                if entry.st_nlink > 1:
                    key = (entry.st_dev, entry.st_ino)
                    if key in self._seen:
                        continue
                    self._seen.add(key)
                self.total += entry.st_blocks * 512
                self.files += 1
        finally:
            if cur >= 0 and (not stack or stack[-1][0] < 0):
                os.close(cur)  # not held by a level (the top itself, when listing it failed)
            for level in stack:
                if level[0] >= 0:
                    os.close(level[0])
        return self.total

    def _descend(self, stack: list[list[Any]], cur: int, name: str) -> int:
        try:
            child = os.open(name, _PATH_FLAGS, dir_fd=cur)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                raise
            return cur  # gone, or swapped for a symlink: not followed
        try:
            info, names = self._enter(child)
        except BaseException:
            os.close(child)
            raise
        if stack[-1][0] < 0:
            os.close(cur)  # an unheld level: reached again through `..` on the way back
        held = child if len(stack) < self.HELD_LEVELS else -1
        stack.append([held, name, names, info.st_dev, info.st_ino])
        return child

    def _leave(self, stack: list[list[Any]], cur: int) -> int:
        level = stack.pop()
        if level[0] >= 0:
            os.close(level[0])
            return stack[-1][0] if stack else -1
        if not stack:
            os.close(cur)
            return -1
        if stack[-1][0] >= 0:
            os.close(cur)
            return int(stack[-1][0])
        try:
            up = self._parent(cur, stack)
        finally:
            os.close(cur)
        return up

    def _parent(self, cur: int, stack: list[list[Any]]) -> int:
        want = (stack[-1][3], stack[-1][4])
        try:
            up = os.open("..", _PATH_FLAGS, dir_fd=cur)
        except OSError:
            up = -1
        if up >= 0:
            info = os.fstat(up)
            if (info.st_dev, info.st_ino) == want:
                return up
            os.close(up)
        held = max(i for i, level in enumerate(stack) if level[0] >= 0)
        fd: int = stack[held][0]
        for level in stack[held + 1 :]:
            try:
                next_fd = os.open(level[1], _PATH_FLAGS, dir_fd=fd)
            finally:
                if fd != stack[held][0]:
                    os.close(fd)
            fd = next_fd
        return fd

    def _enter(self, path_fd: int) -> tuple[os.stat_result, list[str]]:
        """Count the directory `path_fd` (an O_PATH descriptor) and list what it holds."""
        info = os.fstat(path_fd)
        self.total += info.st_blocks * 512
        self.files += 1
        if info.st_mode & _OWNER_RX != _OWNER_RX and info.st_uid == os.geteuid():
            # Taken away by a program to hide what it writes there; given back so it is measured.
            os.chmod(f"/proc/self/fd/{path_fd}", stat.S_IMODE(info.st_mode) | _OWNER_RX)
        try:
            # Reopened through the O_PATH descriptor's magic link: the very inode checked above.
            dir_fd = os.open(f"/proc/self/fd/{path_fd}", _REOPEN_FLAGS)
        except OSError:
            return info, []
        try:
            with os.scandir(dir_fd) as listing:
                if self._budget is None:
                    return info, [entry.name for entry in listing]
                names: list[str] = []
                for entry in listing:  # counted as listed: a huge directory is not read to its end
                    self._budget -= 1
                    if self._budget < 0:
                        raise TooManyEntries()
                    names.append(entry.name)
                return info, names
        finally:
            os.close(dir_fd)


@dataclass(frozen=True)
class WorkspaceQuota:
    """The disk one session's workspace may use — bytes, and files (inodes: a file costs the
    host one however small, and every measure of the workspace looks at each) — and the
    sentences that say it was reached. `limit_files` 0: no file limit."""

    limit_bytes: int
    limit_files: int = 0

    def files_over(self, files: int) -> bool:
        return bool(self.limit_files) and files > self.limit_files

    def files_at_limit(self, files: int) -> bool:
        return bool(self.limit_files) and files >= self.limit_files

    def files_detail(self, files: int, *, stopped: bool) -> str:
        what = "and the command was stopped" if stopped else "after the command"
        return (
            f"the session's workspace holds {files} files and directories, over its limit of {self.limit_files} files, "
            f"{what}; what was made stays, and new files are refused until you delete files you no longer need "
            "(`rm`, or archive a directory: `tar czf d.tgz d && rm -r d`)"
        )

    def refuse_new_file(self, files: int) -> ToolFailure:
        return ToolFailure(
            "disk_quota",
            f"the session's workspace holds {files} files and directories, at its limit of {self.limit_files} files; "
            "nothing was written. Delete files you no longer need (`rm` in the shell tool) to make room",
            {"quota_files": self.limit_files, "usage_files": files},
        )

    def remaining(self, usage: int) -> int:
        return max(self.limit_bytes - usage, 0)

    def over(self, usage: int) -> bool:
        return usage > self.limit_bytes

    def exceeded_detail(self, usage: int, *, stopped: bool) -> str:
        what = "and the command was stopped" if stopped else "after the command"
        where = "over" if self.over(usage) else "at"
        return (
            f"the session's workspace holds {mib(usage)}, {where} its {mib(self.limit_bytes)} disk quota, {what}; "
            "what was written stays, and writes fail until you delete files you no longer need (`rm`)"
        )

    def file_limit_detail(self, usage: int) -> str:
        if not self.remaining(usage):
            return (
                f"the command was stopped when it wrote to a file: the session's workspace holds {mib(usage)}, "
                f"over its {mib(self.limit_bytes)} disk quota, so no file may grow until you delete files you no "
                "longer need (`rm`; space freed counts from the next call)"
            )
        return (
            f"the command was stopped: a file would have grown past the {mib(self.remaining(usage))} left of the "
            f"session's {mib(self.limit_bytes)} disk quota (the workspace holds {mib(usage)}); delete files you no "
            "longer need (`rm`) to make room"
        )

    def refuse_write(self, usage: int, adding: int) -> ToolFailure:
        return ToolFailure(
            "disk_quota",
            f"writing {adding} bytes would take the session's workspace to {mib(usage + adding)}, over its "
            f"{mib(self.limit_bytes)} disk quota (it holds {mib(usage)}); nothing was written. Delete files you no "
            "longer need (`rm` in the shell tool) to make room",
            {"quota_bytes": self.limit_bytes, "usage_bytes": usage},
        )


class UsageMeter:
    """Measures workspaces on threads of its own: watching big workspaces never holds up the
    threads file tools and the rest of the service run on (asyncio's default executor). Under
    load, looks queue here and the watch looks less often, which the overshoot bound allows for.

    A small workspace (most are: a few files) is measured at once on the caller's thread: the
    walk then takes tens of microseconds, less than handing it to a thread and back (which every
    sandboxed call did twice). The walk on the caller's thread stops past `INLINE_ENTRIES`
    entries, so it never holds the event loop for long; such a workspace is remembered as big
    and measured on the meter's threads from then on (until a look finds it small again)."""

    INLINE_ENTRIES = 128
    REMEMBERED = 4096  # big workspaces remembered at once (the oldest forgotten first)

    def __init__(self, threads: int = 4):
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="workspace-usage")
        self._big: OrderedDict[Path, None] = OrderedDict()

    async def usage(self, workspace: Path) -> int:
        return (await self.measure(workspace)).bytes

    async def measure(self, workspace: Path) -> Usage:
        if workspace not in self._big:
            try:
                return measure_workspace(workspace, self.INLINE_ENTRIES)
            except TooManyEntries:
                self._big[workspace] = None
                while len(self._big) > self.REMEMBERED:
                    self._big.popitem(last=False)
        used, small = await asyncio.get_running_loop().run_in_executor(self._pool, _measure, workspace, self.INLINE_ENTRIES)
        if small:
            self._big.pop(workspace, None)
        return used

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _measure(workspace: Path, small_entries: int) -> tuple[Usage, bool]:
    """The workspace's usage, and whether it has at most `small_entries` entries."""
    try:
        return measure_workspace(workspace, small_entries), True
    except TooManyEntries:
        return measure_workspace(workspace), False


class WriteGate:
    """Serialises the file tools' writes per workspace, so two concurrent writes cannot both pass
    the check against the same usage. (Programs in a jail are bounded by the jail's own watch.)
    A fixed set of striped locks: nothing grows with the number of sessions."""

    STRIPES = 64

    def __init__(self) -> None:
        self._locks = [threading.Lock() for _ in range(self.STRIPES)]

    def lock(self, session_id: str) -> threading.Lock:
        return self._locks[hash(session_id) % self.STRIPES]
