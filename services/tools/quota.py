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

import errno
import os
import stat
import threading
from dataclasses import dataclass
from pathlib import Path

from agentmesh.tools.results import ToolFailure

MIB = 1024 * 1024
_REOPEN_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_PATH_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OWNER_RX = stat.S_IRUSR | stat.S_IXUSR


def mib(size: int) -> str:
    """A size for a sentence: `12.5 MiB`."""
    return f"{size / MIB:.1f} MiB"


def workspace_usage(workspace: Path) -> int:
    """Bytes the workspace takes on disk (0 if it does not exist)."""
    try:
        top = os.open(workspace, _PATH_FLAGS)
    except FileNotFoundError:
        return 0
    seen: set[tuple[int, int]] = set()
    try:
        return _directory_usage(top, seen)
    finally:
        os.close(top)


def _directory_usage(path_fd: int, seen: set[tuple[int, int]]) -> int:
    """Usage of the directory `path_fd` (an O_PATH descriptor) and everything beneath it."""
    info = os.fstat(path_fd)
    total = info.st_blocks * 512
    if info.st_mode & _OWNER_RX != _OWNER_RX and info.st_uid == os.geteuid():
        # Taken away by a program to hide what it writes there; given back so it is measured.
        os.chmod(f"/proc/self/fd/{path_fd}", stat.S_IMODE(info.st_mode) | _OWNER_RX)
    try:
        # Reopened through the O_PATH descriptor's magic link: the very inode checked above.
        dir_fd = os.open(f"/proc/self/fd/{path_fd}", _REOPEN_FLAGS)
    except OSError:
        return total
    try:
        with os.scandir(dir_fd) as listing:
            names = [entry.name for entry in listing]
        for name in names:
            try:
                entry = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                continue  # gone meanwhile
            if stat.S_ISDIR(entry.st_mode):
                try:
                    sub = os.open(name, _PATH_FLAGS, dir_fd=dir_fd)
                except OSError as exc:
                    if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                        raise
                    continue  # gone, or swapped for a symlink: not followed
                try:
                    total += _directory_usage(sub, seen)
                finally:
                    os.close(sub)
                continue
            if entry.st_nlink > 1:
                key = (entry.st_dev, entry.st_ino)
                if key in seen:
                    continue
                seen.add(key)
            total += entry.st_blocks * 512
    finally:
        os.close(dir_fd)
    return total


@dataclass(frozen=True)
class WorkspaceQuota:
    """The disk one session's workspace may use, and the sentences that say it was reached."""

    limit_bytes: int

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


class WriteGate:
    """Serialises the file tools' writes per workspace, so two concurrent writes cannot both pass
    the check against the same usage. (Programs in a jail are bounded by the jail's own watch.)
    A fixed set of striped locks: nothing grows with the number of sessions."""

    STRIPES = 64

    def __init__(self) -> None:
        self._locks = [threading.Lock() for _ in range(self.STRIPES)]

    def lock(self, session_id: str) -> threading.Lock:
        return self._locks[hash(session_id) % self.STRIPES]
