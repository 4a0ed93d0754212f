"""The figures a `python` cell drew, as images of its result: the kernel (session_supervisor.py)
saves them as PNG files in the session's workspace and names them; this reads each back, bounded,
so that the tool service stores it under `.attachments/` (images.py) and the model sees it.

Only PNG (what the kernel saves; a cell's own `.png` that is something else is named, not shown),
at most `max_images` per cell (the first ones; every image is resent with later model calls) and
`max_bytes` each. The files were written by the sandbox: they are opened beneath the workspace
without following symlinks, and only regular files are read.
"""

from __future__ import annotations

import os
from typing import Sequence

from agentmesh.images import ImageRef, media_type_of
from agentmesh.tools.beneath import open_beneath
from agentmesh.tools.images import image_of
from agentmesh.tools.results import ToolFailure
from agentmesh.tools.workspace import Workspaces

__all__ = ["CellImages"]


class CellImages:
    def __init__(self, workspaces: Workspaces, max_bytes: int, max_images: int):
        self._workspaces = workspaces
        self._max_bytes = max_bytes
        self._max_images = max_images

    def read(self, session_id: str, paths: Sequence[str]) -> tuple[tuple[ImageRef, ...], list[str]]:
        """(the images, with their bytes; a sentence for each figure that is not shown and why).
        Runs in a worker thread."""
        images: list[ImageRef] = []
        notes: list[str] = []
        for path in paths[:self._max_images]:
            got = self._one(session_id, path)
            if isinstance(got, str):
                notes.append(f"[figure {path} is not shown: {got}]")
            else:
                images.append(got)
        if rest := paths[self._max_images:]:
            notes.append(f"[{len(rest)} more figure(s) not shown, at most {self._max_images} per call "
                         f"(AGENTMESH_TOOLS_MAX_CELL_IMAGES): {', '.join(rest)}; read_file shows one]")
        return tuple(images), notes

    def _one(self, session_id: str, path: str) -> ImageRef | str:
        try:
            workspace, real = self._workspaces.resolve(session_id, path)
            fd = open_beneath(workspace, real, os.O_RDONLY)  # a regular file, or ToolFailure
        except ToolFailure as exc:
            return exc.message
        except OSError as exc:
            return f"it could not be opened ({exc.strerror or exc})"
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            if info.st_size > self._max_bytes:
                return (f"{info.st_size} bytes, over the {self._max_bytes}-byte limit for images "
                        "(AGENTMESH_TOOLS_MAX_IMAGE_BYTES); save it smaller (a lower dpi)")
            data = handle.read(self._max_bytes + 1)
        if len(data) > self._max_bytes:
            return f"it grew past the {self._max_bytes}-byte limit for images while it was read"
        if media_type_of(data) != "image/png":
            return "it is not a PNG image"
        image = image_of(data, path.rsplit("/", 1)[-1])
        return image if image is not None else "it could not be read as a PNG image"
