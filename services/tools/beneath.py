"""Opening and walking files strictly beneath a workspace, immune to symlinks swapped in mid-way.

A path is checked once with `realpath` (workspace.resolve_inside); between that check and the
open, a program of the same session running in its jail could replace a directory on the way
with a symlink to `/`. So the open walks the checked path one component at a time from a file
descriptor of the workspace, each step with O_NOFOLLOW: a symlink met anywhere fails the open
(ELOOP/ENOTDIR) instead of being followed. Walks (list_dir, glob, grep) read directories through
descriptors the same way.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from agentmesh.tools.results import ToolFailure

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _escape(shown: str) -> ToolFailure:
    return ToolFailure("path_escape", f"{shown!r} changed into a symlink while it was being opened; it was not followed")


def _parts(workspace: Path, real: Path) -> list[str]:
    rel = os.path.relpath(real, os.path.realpath(workspace))
    return [] if rel == "." else rel.split(os.sep)


def open_beneath(
    workspace: Path,
    real: Path,
    flags: int,
    mode: int = 0o644,
    *,
    make_parents: bool = False,
    adopt: Callable[[int], None] | None = None,
) -> int:
    """Open `real` (already resolved inside `workspace`) without following any symlink on the way.

    With `make_parents`, missing directories are created (and handed to `adopt(fd)`); a file
    created by the open is handed to `adopt` too.
    """
    parts = _parts(workspace, real)
    shown = "/".join(parts) or "."
    fd = os.open(os.path.realpath(workspace), DIR_FLAGS)
    try:
        for part in parts[:-1]:
            try:
                next_fd = os.open(part, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not make_parents:
                    raise
                os.mkdir(part, 0o755, dir_fd=fd)
                next_fd = os.open(part, DIR_FLAGS, dir_fd=fd)
                if adopt:
                    adopt(next_fd)
            os.close(fd)
            fd = next_fd
        if not parts:
            return os.dup(fd) if flags & os.O_DIRECTORY else os.open(".", flags | os.O_CLOEXEC, dir_fd=fd)
        created = bool(flags & os.O_CREAT) and not _exists(parts[-1], fd)
        # O_NONBLOCK: a FIFO swapped in for the file would otherwise block this thread forever.
        result = os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode, dir_fd=fd)
        if not flags & os.O_DIRECTORY:
            result = _regular_only(result, shown)
        if created and adopt:
            adopt(result)
        return result
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _escape(shown) from None
        if exc.errno == errno.ENXIO:  # a FIFO with no reader, opened for writing
            raise ToolFailure("not_a_file", f"{shown} is not a regular file") from None
        raise
    finally:
        os.close(fd)


def _regular_only(fd: int, shown: str) -> int:
    """Keep `fd` only if it is a regular file, back in blocking mode."""
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ToolFailure("not_a_file", f"{shown} is not a regular file")
    os.set_blocking(fd, True)
    return fd


def _exists(name: str, dir_fd: int) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False


@dataclass
class Entry:
    path: str  # relative to the walk's start
    name: str
    kind: str  # "file" | "dir" | "symlink" | "other"
    size: int
    target: str  # a symlink's target, as text
    dir_fd: int  # the descriptor of the directory holding it, valid while the walk yields it

    def open(self) -> int:
        """Open a file entry for reading, never through a symlink, and only if still a regular file."""
        fd = os.open(self.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=self.dir_fd)
        return _regular_only(fd, self.path)


def walk_beneath(workspace: Path, start: Path, max_depth: int = 64, max_entries: int = 50_000) -> Iterator[Entry]:
    """Everything under `start` (resolved inside `workspace`), depth first in name order, never
    through symlinks; stops after `max_entries`."""
    top = open_beneath(workspace, start, DIR_FLAGS)
    seen = 0

    def walk(dir_fd: int, prefix: str, depth: int) -> Iterator[Entry]:
        nonlocal seen
        with os.scandir(dir_fd) as listing:
            children = sorted(listing, key=lambda e: e.name)
        for child in children:
            seen += 1
            if seen > max_entries:
                return
            rel = f"{prefix}{child.name}"
            try:
                info = os.stat(child.name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISLNK(info.st_mode):
                try:
                    target = os.readlink(child.name, dir_fd=dir_fd)
                except OSError:
                    target = "?"
                yield Entry(rel, child.name, "symlink", 0, target, dir_fd)
            elif stat.S_ISDIR(info.st_mode):
                yield Entry(rel, child.name, "dir", 0, "", dir_fd)
                if depth > 1:
                    try:
                        sub = os.open(child.name, DIR_FLAGS, dir_fd=dir_fd)
                    except OSError:
                        continue  # swapped for a symlink meanwhile, or gone: not followed
                    try:
                        yield from walk(sub, rel + "/", depth - 1)
                    finally:
                        os.close(sub)
            elif stat.S_ISREG(info.st_mode):
                yield Entry(rel, child.name, "file", info.st_size, "", dir_fd)
            else:
                yield Entry(rel, child.name, "other", 0, "", dir_fd)

    try:
        yield from walk(top, "", max_depth)
    finally:
        os.close(top)
