"""A session's workspace as people see it: list a directory, view a file, upload one.

The model reaches the workspace through the file tools; the web console reaches it through
here, under the same rules — every path resolved by `workspace.resolve_inside` (no `..` or
symlink out) and opened by `beneath.py` (no symlink swapped in mid-way is followed). Unlike the
tools, whose mistakes become results the model reads, these answer with errors: a path that
leaves the workspace is INVALID_ARGUMENT, a missing one NOT_FOUND.
"""

from __future__ import annotations

import asyncio
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

from agentmesh import error_reasons
from agentmesh.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from agentmesh.images import ATTACHMENTS_DIR
from agentmesh.tools.beneath import DIR_FLAGS, open_beneath
from agentmesh.tools.quota import WorkspaceQuota, WriteGate, measure_workspace
from agentmesh.tools.results import ToolFailure
from agentmesh.tools.tree_copy import Copied
from agentmesh.tools.workspace import Workspaces, display_path
from agentmesh.tools.workspace_copy import copy_workspace

T = TypeVar("T")

MAX_LISTED_ENTRIES = 1000
MAX_PATH_CHARS = 4096


@dataclass(frozen=True)
class WorkspaceEntry:
    path: str
    name: str
    type: str  # "file" | "dir" | "symlink" | "other"
    size: int
    modified_at: float


@dataclass(frozen=True)
class Listing:
    path: str
    entries: list[WorkspaceEntry]
    truncated: bool


@dataclass(frozen=True)
class FileView:
    path: str
    content: bytes
    size: int
    truncated: bool


@dataclass(frozen=True)
class Written:
    path: str
    size: int
    created: bool


def _as_error(failure: ToolFailure) -> Exception:
    if failure.kind == "not_found":
        return NotFound(failure.message)
    if failure.kind == "disk_quota":
        # The session's disk quota (AGENTMESH_TOOLS_WORKSPACE_QUOTA_MB), with its figures.
        return ResourceExhausted(failure.message, reason=error_reasons.QUOTA_EXCEEDED,
                                 metadata={"limit": "workspace_quota", **{k: str(v) for k, v in failure.data.items()}})
    return InvalidArgument(failure.message)


class WorkspaceFiles:
    def __init__(self, workspaces: Workspaces, max_view_bytes: int, max_upload_bytes: int, quota: WorkspaceQuota,
                 max_image_bytes: int = 0):
        self._workspaces = workspaces
        self._max_view_bytes = max_view_bytes
        self.max_upload_bytes = max_upload_bytes
        # Stored images (.attachments/, agentmesh.images) are written and read whole, up to this.
        self._max_image_bytes = max_image_bytes
        self._quota = quota
        # Uploads to one workspace one at a time, so two cannot both pass the quota check.
        self._gate = WriteGate()

    async def copy(self, from_session: str, to_session: str) -> Copied:
        """A forked session's workspace, copied from its source's (workspace_copy.py)."""
        return await copy_workspace(self._workspaces, self._quota, from_session, to_session)

    async def list(self, session_id: str, user_path: str) -> Listing:
        return await asyncio.to_thread(self._guarded, self._list, session_id, user_path)

    async def read(self, session_id: str, user_path: str, max_bytes: int = 0, *, images: bool = False) -> FileView:
        """`images`: the caller reads an image whole (the agent), up to the image bound."""
        if max_bytes < 0:
            raise InvalidArgument(f"max_bytes must not be negative, got {max_bytes}")
        bound = self._max_view_bytes
        if images or is_stored_image(user_path):
            bound = max(bound, self._max_image_bytes)
        limit = min(max_bytes or bound, bound)
        return await asyncio.to_thread(self._guarded, self._read, session_id, user_path, limit)

    async def write(self, session_id: str, user_path: str, content: bytes, overwrite: bool) -> Written:
        if not user_path.strip():
            raise InvalidArgument("path is required: where in the workspace to put the file, e.g. 'data/input.csv'")
        limit = max(self.max_upload_bytes, self._max_image_bytes) if is_stored_image(user_path) else self.max_upload_bytes
        if len(content) > limit:
            raise InvalidArgument(
                f"the file is {len(content)} bytes; {'images' if limit != self.max_upload_bytes else 'uploads'} "
                f"are limited to {limit} bytes"
            )
        return await asyncio.to_thread(self._guarded, self._write, session_id, user_path, content, overwrite)

    @staticmethod
    def _guarded(work: Callable[..., T], session_id: str, user_path: str, *args: Any) -> T:
        if len(user_path) > MAX_PATH_CHARS:
            raise InvalidArgument(f"path is {len(user_path)} characters; at most {MAX_PATH_CHARS}")
        try:
            return work(session_id, user_path, *args)
        except ToolFailure as failure:
            raise _as_error(failure) from None

    def _resolve(self, session_id: str, user_path: str) -> tuple[Path, Path, str]:
        workspace, real = self._workspaces.resolve(session_id, user_path)
        return workspace, real, display_path(workspace, real)

    def _list(self, session_id: str, user_path: str) -> Listing:
        workspace, real, shown = self._resolve(session_id, user_path)
        try:
            fd = open_beneath(workspace, real, DIR_FLAGS)
        except FileNotFoundError:
            raise NotFound(f"{shown} does not exist in the workspace") from None
        except NotADirectoryError:
            raise InvalidArgument(f"{shown} is not a directory") from None
        entries: list[WorkspaceEntry] = []
        truncated = False
        try:
            with os.scandir(fd) as listing:
                names = sorted(entry.name for entry in listing)
            for name in names:
                if len(entries) >= MAX_LISTED_ENTRIES:
                    truncated = True
                    break
                try:
                    info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except OSError:
                    continue  # removed while we looked
                rel = name if shown == "." else f"{shown}/{name}"
                entries.append(WorkspaceEntry(rel, name, _kind(info.st_mode), info.st_size, info.st_mtime))
        finally:
            os.close(fd)
        # Directories first, then files, each by name: what a file browser shows.
        entries.sort(key=lambda e: (e.type != "dir", e.name))
        return Listing("" if shown == "." else shown, entries, truncated)

    def _read(self, session_id: str, user_path: str, limit: int) -> FileView:
        workspace, real, shown = self._resolve(session_id, user_path)
        try:
            info = os.stat(real, follow_symlinks=False)
        except FileNotFoundError:
            raise NotFound(f"{shown} does not exist in the workspace") from None
        if stat.S_ISDIR(info.st_mode):
            raise InvalidArgument(f"{shown} is a directory; list it instead")
        fd = open_beneath(workspace, real, os.O_RDONLY)
        with os.fdopen(fd, "rb") as handle:
            content = handle.read(limit + 1)
        return FileView(shown, content[:limit], info.st_size, len(content) > limit)

    def _write(self, session_id: str, user_path: str, content: bytes, overwrite: bool) -> Written:
        workspace, real, shown = self._resolve(session_id, user_path)
        if real == Path(os.path.realpath(workspace)) or real.is_dir():
            raise InvalidArgument(f"{shown} is a directory; give a file path")
        exists = real.exists()
        if exists and not overwrite:
            raise AlreadyExists(f"{shown} already exists in the workspace; set overwrite to replace it")
        flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if overwrite else os.O_EXCL)
        with self._gate.lock(session_id):
            # The session's disk quota holds for uploads as for the file tools' writes.
            adding = len(content) - (_allocated(real) if exists else 0)
            if adding > 0 or not exists:
                usage = measure_workspace(workspace)
                if not exists and self._quota.files_at_limit(usage.files):
                    raise self._quota.refuse_new_file(usage.files)
                if adding > 0 and self._quota.over(usage.bytes + adding):
                    raise self._quota.refuse_write(usage.bytes, adding)
            try:
                fd = open_beneath(workspace, real, flags, make_parents=True, adopt=self._workspaces.adopt_fd)
            except FileExistsError:
                raise AlreadyExists(f"{shown} already exists in the workspace; set overwrite to replace it") from None
            except NotADirectoryError:
                raise FailedPrecondition(f"a file stands where a directory of {shown} should be") from None
            with os.fdopen(fd, "wb") as handle:
                handle.write(content)
        return Written(shown, len(content), not exists)


def is_stored_image(user_path: str) -> bool:
    """A path of the workspace's stored images (agentmesh.images), which have their own bound."""
    return user_path.removeprefix("/workspace/").startswith(ATTACHMENTS_DIR + "/")


def _allocated(real: Path) -> int:
    """Disk a regular file takes now (what replacing it frees); 0 if there is none."""
    try:
        info = os.stat(real, follow_symlinks=False)
    except OSError:
        return 0
    return info.st_blocks * 512 if stat.S_ISREG(info.st_mode) else 0


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"
