"""Deleting a directory tree of any depth: a program (or an upload path) may nest directories
thousands deep, past Python's recursion limit (shutil.rmtree recurses, one frame and one open
descriptor per level) and past PATH_MAX (so paths cannot name the deep levels either).

The walk holds one directory descriptor at a time, goes down by name with O_NOFOLLOW (a symlink
is removed, never followed) and back up through `..`, checked against the device and inode
recorded on the way down: if a tree was moved meanwhile, it stops rather than delete elsewhere.
Directories a program locked (chmod 0) are given back their owner's rwx first.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PATH_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OWNER_RWX = stat.S_IRWXU


def remove_tree(top: Path) -> None:
    """Remove the directory `top` and everything under it, without recursion."""
    cur = _open_dir(os.fspath(top), None)
    # Per level: (device, inode, name in its parent, subdirectories not yet removed).
    stack: list[tuple[int, int, str, list[str]]] = []
    try:
        info = os.fstat(cur)
        stack.append((info.st_dev, info.st_ino, "", _clear_files(cur)))
        while stack:
            subdirs = stack[-1][3]
            if subdirs:
                name = subdirs.pop()
                try:
                    child = _open_dir(name, cur)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                        raise
                    os.unlink(name, dir_fd=cur)  # swapped for a file or symlink meanwhile: not entered
                    continue
                os.close(cur)
                cur = child
                info = os.fstat(cur)
                stack.append((info.st_dev, info.st_ino, name, _clear_files(cur)))
                continue
            _, _, name, _ = stack.pop()
            if not stack:
                break
            parent = os.open("..", _DIR_FLAGS, dir_fd=cur)
            up = os.fstat(parent)
            os.close(cur)
            cur = parent
            if (up.st_dev, up.st_ino) != stack[-1][:2]:
                raise OSError(errno.ESTALE, "the directory tree was moved while it was being deleted", str(top))
            os.rmdir(name, dir_fd=cur)
    finally:
        os.close(cur)
    os.rmdir(top)


def _open_dir(name: str, dir_fd: int | None) -> int:
    """A directory opened for listing, its owner's rwx given back when a program took it away."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        pass
    path_fd = os.open(name, _PATH_FLAGS, dir_fd=dir_fd)
    try:
        os.chmod(f"/proc/self/fd/{path_fd}", stat.S_IMODE(os.fstat(path_fd).st_mode) | _OWNER_RWX)
        return os.open(f"/proc/self/fd/{path_fd}", _DIR_FLAGS)
    finally:
        os.close(path_fd)


def _clear_files(dir_fd: int) -> list[str]:
    """Unlink everything in the directory but its subdirectories, and name those."""
    info = os.fstat(dir_fd)
    if info.st_mode & _OWNER_RWX != _OWNER_RWX:  # unlinking needs write and search permission
        os.chmod(f"/proc/self/fd/{dir_fd}", stat.S_IMODE(info.st_mode) | _OWNER_RWX)
    subdirs = []
    with os.scandir(dir_fd) as listing:
        for entry in listing:
            if entry.is_dir(follow_symlinks=False):
                subdirs.append(entry.name)
                continue
            try:
                os.unlink(entry.name, dir_fd=dir_fd)
            except FileNotFoundError:
                pass
    return subdirs
