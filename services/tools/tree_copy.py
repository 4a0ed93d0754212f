"""Copying a workspace into a new one (a forked session's): a tree of any depth, never following
a symlink — a link is copied as a link, so a program that planted one pointing out of its
workspace reaches no more through the copy than through the original.

As in `tree_delete.py`, the walk holds one directory descriptor per side, goes down by name with
O_NOFOLLOW and back up through `..`, checked against the device and inode recorded on the way
down: a tree moved meanwhile stops the copy rather than read elsewhere. Files are opened with
O_NOFOLLOW relative to their directory's descriptor; fifos, sockets and devices are left out.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

__all__ = ["Copied", "copy_tree"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20


@dataclass
class Copied:
    files: int = 0  # files, directories and links made
    bytes: int = 0  # bytes of file content copied


def copy_tree(source: Path, target: Path, adopt_fd: Callable[[int], None] | None = None) -> Copied:
    """Copy the directory `source` to `target`, which must not exist (FileExistsError). `adopt_fd`
    gives each file and directory made to the jail's user (Workspaces.adopt_fd)."""
    copied = Copied()
    os.mkdir(target, 0o700)
    src = os.open(source, _DIR_FLAGS)
    dst = os.open(target, _DIR_FLAGS)
    if adopt_fd is not None:
        adopt_fd(dst)
    # Per level: the source directory's (device, inode), and its subdirectories not yet copied.
    stack: list[tuple[int, int, list[str]]] = []
    try:
        info = os.fstat(src)
        stack.append((info.st_dev, info.st_ino, _copy_entries(src, dst, copied, adopt_fd)))
        while stack:
            subdirs = stack[-1][2]
            if subdirs:
                name = subdirs.pop()
                try:
                    child = os.open(name, _DIR_FLAGS, dir_fd=src)
                except OSError as exc:
                    if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                        continue  # gone or swapped for a file or link meanwhile: not entered
                    raise
                mode = stat.S_IMODE(os.fstat(child).st_mode) | stat.S_IRWXU
                os.mkdir(name, mode, dir_fd=dst)
                made = os.open(name, _DIR_FLAGS, dir_fd=dst)
                if adopt_fd is not None:
                    adopt_fd(made)
                copied.files += 1
                os.close(src)
                os.close(dst)
                src, dst = child, made
                info = os.fstat(src)
                stack.append((info.st_dev, info.st_ino, _copy_entries(src, dst, copied, adopt_fd)))
                continue
            stack.pop()
            if not stack:
                break
            parent = os.open("..", _DIR_FLAGS, dir_fd=src)
            up = os.fstat(parent)
            os.close(src)
            src = parent
            if (up.st_dev, up.st_ino) != stack[-1][:2]:
                raise OSError(errno.ESTALE, "the workspace was moved while it was being copied", str(source))
            parent = os.open("..", _DIR_FLAGS, dir_fd=dst)
            os.close(dst)
            dst = parent
    finally:
        os.close(src)
        os.close(dst)
    return copied


def _copy_entries(src: int, dst: int, copied: Copied, adopt_fd: Callable[[int], None] | None) -> list[str]:
    """Copy the files and links of one directory; return its subdirectories' names."""
    subdirs: list[str] = []
    for entry in os.scandir(src):
        name = entry.name
        try:
            info = os.stat(name, dir_fd=src, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(info.st_mode):
            subdirs.append(name)
        elif stat.S_ISLNK(info.st_mode):
            os.symlink(os.readlink(name, dir_fd=src), name, dir_fd=dst)
            copied.files += 1
        elif stat.S_ISREG(info.st_mode):
            copied.bytes += _copy_file(name, src, dst, adopt_fd)
            copied.files += 1
    return subdirs


def _copy_file(name: str, src: int, dst: int, adopt_fd: Callable[[int], None] | None) -> int:
    try:
        fin = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=src)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP):
            return 0  # removed or swapped for a link meanwhile
        raise
    try:
        info = os.fstat(fin)
        if not stat.S_ISREG(info.st_mode):
            return 0
        fout = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                       stat.S_IMODE(info.st_mode) | stat.S_IRUSR | stat.S_IWUSR, dir_fd=dst)
        try:
            if adopt_fd is not None:
                adopt_fd(fout)
            total = 0
            while chunk := os.read(fin, _CHUNK):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fout, view):]
                total += len(chunk)
            return total
        finally:
            os.close(fout)
    finally:
        os.close(fin)

