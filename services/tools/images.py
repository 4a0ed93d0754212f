"""Images a tool call produced (read_file of an image, an MCP tool's image content), stored once
in the session's workspace before the result leaves the service.

A tool puts the image's bytes in its outcome (`ImageRef.data`); `store_images` writes each under
the workspace's `.attachments/` folder, named by its hash (agentmesh.images), and hands on the
reference only — so the agent's transcript holds a path, and the bytes travel to the model only
when a request is built. An image that is no PNG, JPEG, GIF or WebP, or larger than the bound,
is not stored: the result says so in a line of its text instead.
"""

from __future__ import annotations

import dataclasses
import os

from agentmesh.images import ImageRef, attachment_path, image_info
from agentmesh.tools.beneath import open_beneath
from agentmesh.tools.results import ToolOutcome
from agentmesh.tools.workspace import Workspaces

__all__ = ["image_of", "store_images"]


def image_of(data: bytes, name: str) -> ImageRef | None:
    """An image a tool read or received, with its bytes; None when the bytes are no image we take."""
    kind, width, height = image_info(data)
    if not kind:
        return None
    return ImageRef(path=attachment_path(data, kind), media_type=kind, name=name, width=width, height=height,
                    size_bytes=len(data), data=data)


def _write_once(workspaces: Workspaces, session_id: str, image: ImageRef) -> None:
    workspace, real = workspaces.resolve(session_id, image.path)
    if real.exists():  # the name is the bytes' hash: the file already holds them
        return
    fd = open_beneath(workspace, real, os.O_WRONLY | os.O_CREAT | os.O_EXCL, make_parents=True,
                      adopt=workspaces.adopt_fd)
    with os.fdopen(fd, "wb") as handle:
        handle.write(image.data)


def store_images(workspaces: Workspaces, session_id: str, outcome: ToolOutcome, max_bytes: int) -> ToolOutcome:
    """`outcome` with each image stored and referenced by path (runs in a worker thread)."""
    kept: list[ImageRef] = []
    notes: list[str] = []
    for image in outcome.images:
        if not image.data:
            kept.append(image)
            continue
        if image.size_bytes > max_bytes or len(image.data) > max_bytes:
            notes.append(image.described(f"{len(image.data)} bytes, over the {max_bytes}-byte limit for images "
                                         "(AGENTMESH_TOOLS_MAX_IMAGE_BYTES); not shown"))
            continue
        try:
            _write_once(workspaces, session_id, image)
        except (OSError, FileExistsError) as exc:
            notes.append(image.described(f"could not be stored ({exc.strerror or exc}); not shown"))
            continue
        kept.append(dataclasses.replace(image, data=b""))
    output = "\n".join([outcome.output, *notes]) if notes else outcome.output
    return dataclasses.replace(outcome, output=output, images=tuple(kept))

