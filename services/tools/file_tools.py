"""File tools that run in the tools service itself (no program of the model's runs, so no jail).

They touch only the session workspace: every path goes through `resolve_inside`, files are
opened with O_NOFOLLOW, and directory walks never follow symlinks.
"""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

from agentmesh.images import media_type_of
from agentmesh.tools.beneath import open_beneath, walk_beneath
from agentmesh.tools.catalog import CallContext, Tool, ToolSpec, boolean, integer, obj, string
from agentmesh.tools.images import image_of
from agentmesh.tools.quota import WorkspaceQuota, WriteGate, measure_workspace
from agentmesh.tools.results import ToolFailure, ToolOutcome
from agentmesh.tools.workspace import Workspaces, display_path

MAX_WRITE_CHARS = 1_000_000
MAX_LIST_ENTRIES = 1000


class FileTools:
    def __init__(self, workspaces: Workspaces, max_read_bytes: int, quota: WorkspaceQuota,
                 max_image_bytes: int = 5 * 1024 * 1024):
        self._workspaces = workspaces
        self._max_read_bytes = max_read_bytes
        self._max_image_bytes = max_image_bytes
        self._quota = quota
        self._gate = WriteGate()

    def tools(self) -> list[Tool]:
        return [
            Tool(
                ToolSpec(
                    "read_file",
                    "Read a text file from the workspace. Returns up to `limit` lines starting at line `offset` (1-based). "
                    "An image file (PNG, JPEG, GIF, WebP) — one you were given or one your code drew — is "
                    "returned as the image itself, for you to look at.",
                    obj(
                        {
                            "path": string("File path, relative to the workspace.", min_length=1),
                            "offset": integer("First line to return (1-based). Default 1.", 1, 10_000_000),
                            "limit": integer("How many lines to return. Default 2000.", 1, 100_000),
                        },
                        ["path"],
                    ), read_only=True),
                self.read_file,
            ),
            Tool(
                ToolSpec(
                    "write_file",
                    "Write a text file in the workspace, creating parent directories. Replaces the file unless `append` is true.",
                    obj(
                        {
                            "path": string("File path, relative to the workspace.", min_length=1),
                            "content": string("The text to write.", max_length=MAX_WRITE_CHARS),
                            "append": boolean("Append to the file instead of replacing it. Default false."),
                        },
                        ["path", "content"],
                    ),
                ),
                self.write_file,
            ),
            Tool(
                ToolSpec(
                    "edit_file",
                    "Replace one exact, unique occurrence of `old` with `new` in a workspace file.",
                    obj(
                        {
                            "path": string("File path, relative to the workspace.", min_length=1),
                            "old": string("The exact text to replace; it must occur exactly once.", max_length=MAX_WRITE_CHARS, min_length=1),
                            "new": string("The replacement text.", max_length=MAX_WRITE_CHARS),
                        },
                        ["path", "old", "new"],
                    ),
                ),
                self.edit_file,
            ),
            Tool(
                ToolSpec(
                    "list_dir",
                    "List a workspace directory, `depth` levels deep (directories end with '/').",
                    obj(
                        {
                            "path": string("Directory path, relative to the workspace. Default '.'."),
                            "depth": integer("How many levels to descend. Default 1.", 1, 5),
                        },
                        [],
                    ), read_only=True),
                self.list_dir,
            ),
        ]

    # --- read_file -------------------------------------------------------------------------

    async def read_file(self, ctx: CallContext, args: dict[str, Any]) -> ToolOutcome:
        return await asyncio.to_thread(self._read, ctx.session_id, args["path"], args.get("offset", 1), args.get("limit", 2000))

    def _read(self, session_id: str, user_path: str, offset: int, limit: int) -> ToolOutcome:
        workspace, real = self._workspaces.resolve(session_id, user_path)
        shown = display_path(workspace, real)
        info = _stat_existing(real, shown)
        if stat.S_ISDIR(info.st_mode):
            raise ToolFailure("is_a_directory", f"{shown} is a directory; use list_dir to see what it holds")
        if not stat.S_ISREG(info.st_mode):
            raise ToolFailure("not_a_file", f"{shown} is not a regular file")
        fd = open_beneath(workspace, real, os.O_RDONLY)
        with os.fdopen(fd, "rb") as handle:
            head = handle.read(8192)
            if media_type_of(head):
                return self._image(handle, shown, info.st_size)
            if b"\x00" in head:
                raise ToolFailure("binary_file", f"{shown} looks like a binary file ({info.st_size} bytes); it was not read")
            handle.seek(0)
            lines: list[str] = []
            used = 0
            line_no = 0
            truncated = False
            for raw in handle:
                line_no += 1
                if line_no < offset:
                    continue
                if len(lines) >= limit or used + len(raw) > self._max_read_bytes:
                    truncated = True
                    break
                lines.append(raw.decode("utf-8", errors="replace"))
                used += len(raw)
        text = "".join(lines)
        end = offset + len(lines) - 1
        data = {"path": shown, "start_line": offset, "end_line": max(end, offset - 1), "truncated": truncated, "size": info.st_size}
        if truncated:
            text += f"\n[... shown lines {offset}-{end}; more follows: read again with offset={end + 1} ...]"
        elif offset > 1 and not lines:
            text = f"[{shown} has fewer than {offset} lines]"
        return ToolOutcome(output=text, truncated=truncated, data=data)

    def _image(self, handle: BinaryIO, shown: str, size: int) -> ToolOutcome:
        """An image file as an image (stored and shown to the model by core.py's result path)."""
        if size > self._max_image_bytes:
            raise ToolFailure("image_too_large", f"{shown} is an image of {size} bytes; images of at most "
                                                 f"{self._max_image_bytes} bytes are shown (AGENTMESH_TOOLS_MAX_IMAGE_BYTES)")
        handle.seek(0)
        image = image_of(handle.read(self._max_image_bytes + 1), shown.rsplit("/", 1)[-1])
        if image is None:
            raise ToolFailure("binary_file", f"{shown} looks like an image but could not be read as one")
        data = {"path": shown, "size": size, "media_type": image.media_type, "width": image.width, "height": image.height}
        return ToolOutcome(output=image.described("shown to you as an image"), data=data, images=(image,))

    # --- write_file ------------------------------------------------------------------------

    async def write_file(self, ctx: CallContext, args: dict[str, Any]) -> ToolOutcome:
        return await asyncio.to_thread(self._write, ctx.session_id, args["path"], args["content"], args.get("append", False))

    def _write(self, session_id: str, user_path: str, content: str, append: bool) -> ToolOutcome:
        workspace, real = self._workspaces.resolve(session_id, user_path)
        shown = display_path(workspace, real)
        if real.is_dir():
            raise ToolFailure("is_a_directory", f"{shown} is a directory; give a file path")
        data = content.encode("utf-8")
        flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
        with self._gate.lock(session_id):
            freed = 0 if append else _allocated(real)
            self._check_quota(workspace, len(data) - freed, new_file=not os.path.lexists(real))
            fd = open_beneath(workspace, real, flags, make_parents=True, adopt=self._workspaces.adopt_fd)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
        verb = "appended" if append else "wrote"
        return ToolOutcome(output=f"{verb} {len(data)} bytes to {shown}", data={"path": shown, "bytes": len(data), "append": append})

    # --- edit_file -------------------------------------------------------------------------

    async def edit_file(self, ctx: CallContext, args: dict[str, Any]) -> ToolOutcome:
        return await asyncio.to_thread(self._edit, ctx.session_id, args["path"], args["old"], args["new"])

    def _edit(self, session_id: str, user_path: str, old: str, new: str) -> ToolOutcome:
        workspace, real = self._workspaces.resolve(session_id, user_path)
        shown = display_path(workspace, real)
        info = _stat_existing(real, shown)
        if not stat.S_ISREG(info.st_mode):
            raise ToolFailure("not_a_file", f"{shown} is not a regular file")
        if info.st_size > MAX_WRITE_CHARS * 4:
            raise ToolFailure("file_too_large", f"{shown} is {info.st_size} bytes, too large to edit in place")
        fd = open_beneath(workspace, real, os.O_RDONLY)
        with os.fdopen(fd, "rb") as handle:
            raw = handle.read()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ToolFailure("binary_file", f"{shown} is not UTF-8 text; edit_file works on text files only") from None
        count = text.count(old)
        if count == 0:
            raise ToolFailure("no_match", f"the text to replace was not found in {shown}; read the file and copy the exact text, whitespace included")
        if count > 1:
            raise ToolFailure("ambiguous_match", f"the text to replace occurs {count} times in {shown}; include more surrounding text so it occurs exactly once")
        updated = text.replace(old, new, 1).encode("utf-8")
        line = text[: text.index(old)].count("\n") + 1
        with self._gate.lock(session_id):
            self._check_quota(workspace, len(updated) - len(raw))
            fd = open_beneath(workspace, real, os.O_WRONLY | os.O_TRUNC)
            with os.fdopen(fd, "wb") as handle:
                handle.write(updated)
        return ToolOutcome(output=f"edited {shown} at line {line}", data={"path": shown, "line": line})

    def _check_quota(self, workspace: Path, adding: int, new_file: bool = False) -> None:
        """Refuse a write that would take the workspace past its quota (bytes, or files when it
        makes one); one that frees space and makes no file always passes."""
        if adding <= 0 and not new_file:
            return
        usage = measure_workspace(workspace)
        if new_file and self._quota.files_at_limit(usage.files):
            raise self._quota.refuse_new_file(usage.files)
        if adding > 0 and self._quota.over(usage.bytes + adding):
            raise self._quota.refuse_write(usage.bytes, adding)

    # --- list_dir --------------------------------------------------------------------------

    async def list_dir(self, ctx: CallContext, args: dict[str, Any]) -> ToolOutcome:
        return await asyncio.to_thread(self._list, ctx.session_id, args.get("path", "."), args.get("depth", 1))

    def _list(self, session_id: str, user_path: str, depth: int) -> ToolOutcome:
        workspace, real = self._workspaces.resolve(session_id, user_path)
        shown = display_path(workspace, real)
        info = _stat_existing(real, shown)
        if not stat.S_ISDIR(info.st_mode):
            raise ToolFailure("not_a_directory", f"{shown} is not a directory; use read_file for files")
        entries: list[dict[str, Any]] = []
        truncated = False
        for entry in walk_beneath(workspace, real, max_depth=depth, max_entries=MAX_LIST_ENTRIES + 1):
            if len(entries) >= MAX_LIST_ENTRIES:
                truncated = True
                break
            item: dict[str, Any] = {"path": entry.path, "type": entry.kind}
            if entry.kind == "file":
                item["size"] = entry.size
            elif entry.kind == "symlink":
                item["target"] = entry.target
            entries.append(item)
        lines = []
        for row in entries:
            suffix = "/" if row["type"] == "dir" else ""
            extra = f" -> {row['target']}" if row["type"] == "symlink" else (f"  ({row['size']} bytes)" if row["type"] == "file" else "")
            lines.append(f"{row['path']}{suffix}{extra}")
        text = "\n".join(lines) if lines else f"{shown} is empty"
        if truncated:
            text += f"\n[... listing stopped at {MAX_LIST_ENTRIES} entries ...]"
        return ToolOutcome(output=text, truncated=truncated, data={"path": shown, "entries": entries})


def _allocated(real: Path) -> int:
    """Disk a regular file takes now (what replacing it frees); 0 if there is none."""
    try:
        info = os.stat(real, follow_symlinks=False)
    except OSError:
        return 0
    return info.st_blocks * 512 if stat.S_ISREG(info.st_mode) else 0


def _stat_existing(real: Path, shown: str) -> os.stat_result:
    try:
        return os.stat(real, follow_symlinks=False)
    except FileNotFoundError:
        raise ToolFailure("not_found", f"{shown} does not exist in the workspace") from None
