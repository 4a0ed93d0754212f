"""Images in a turn: a user's images stored once in the session's workspace before the message
is, and every referenced image read back into the model request that shows it.

Messages hold `ImageRef`s (agentmesh.images) — a path under the workspace's `.attachments/` and
what the image is — never the bytes. `with_images` makes the copy of a request a provider
sends: each referenced image with its bytes for a model that takes images, or, for one whose
catalogue entry says `vision: false`, a line of text in its place. An image that cannot be read
back (its file removed) is described the same way, with why: the turn goes on.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

from agentmesh.agent.loop.ports import ImageFiles
from agentmesh.agent.types import ChatMessage, ImageRef, ModelRequest
from agentmesh.errors import AgentmeshError, InvalidArgument
from agentmesh.images import attachment_path, image_info

__all__ = ["NO_VISION", "GivenImage", "ImageReads", "store_given", "with_images"]

NO_VISION = "this model does not take images"


@dataclass(frozen=True)
class GivenImage:
    """An image as a chat request gives it: its bytes, or the path of a workspace file."""

    data: bytes = b""
    path: str = ""
    name: str = ""


def _ref(data: bytes, name: str, where: str) -> ImageRef:
    kind, width, height = image_info(data)
    if not kind:
        raise InvalidArgument(f"{where} is not a PNG, JPEG, GIF or WebP image")
    return ImageRef(path=attachment_path(data, kind), media_type=kind, name=name, width=width, height=height,
                    size_bytes=len(data))


async def store_given(files: ImageFiles | None, session_id: str, given: Sequence[GivenImage],
                      max_bytes: int) -> tuple[ImageRef, ...]:
    """The request's images, each written once under `.attachments/` (a workspace file given by
    path is copied there: the message keeps the picture it was shown even if the file changes).
    Raises InvalidArgument naming the image for a file that is missing or no image."""
    if not given:
        return ()
    if files is None:
        raise InvalidArgument("this agent cannot store images (it has no tools service to keep them in)")
    read: list[tuple[ImageRef, bytes]] = []
    for index, image in enumerate(given):
        where = f"images[{index}]" + (f" ({image.path})" if image.path else "")
        data = image.data
        if not data:
            try:
                data = await files.read(session_id, image.path, max_bytes)
            except AgentmeshError as exc:
                raise InvalidArgument(f"{where}: {exc.message}") from None
        read.append((_ref(data, image.name or image.path.rsplit("/", 1)[-1], where), data))
    # Written only once every one is known good: a refused request leaves nothing behind.
    for ref, data in read:
        await files.write(session_id, ref.path, data)
    return tuple(ref for ref, _ in read)


class ImageReads:
    """The bytes of a turn's images, read once per turn: every model call of the turn shows them."""

    def __init__(self, files: ImageFiles | None, session_id: str, max_bytes: int):
        self._files = files
        self._session_id = session_id
        self._max_bytes = max_bytes
        self._read: dict[str, bytes | str] = {}  # path -> bytes, or why they could not be read

    async def get(self, image: ImageRef) -> bytes | str:
        if image.path not in self._read:
            if self._files is None:
                self._read[image.path] = "the agent has no workspace to read it from"
            else:
                try:
                    self._read[image.path] = await self._files.read(self._session_id, image.path, self._max_bytes)
                except AgentmeshError as exc:
                    self._read[image.path] = f"could not be read back ({exc.message})"
        return self._read[image.path]


async def with_images(request: ModelRequest, vision: bool, reads: ImageReads, *, max_images: int = 20,
                      max_bytes: int = 20 * 1024 * 1024) -> ModelRequest:
    """The request as sent: images with their bytes (vision), or described in the text (not).
    The newest `max_images` images of at most `max_bytes` together are sent; older ones are
    described ("shown earlier"): every call resends the history, and the APIs bound a request
    (Anthropic: 32 MB), so a long session of screenshots would otherwise stop fitting."""
    if not any(m.images for m in request.messages):
        return request
    sent_count, sent_bytes = 0, 0
    out: list[ChatMessage] = []
    for m in reversed(request.messages):  # newest first: they are the ones kept as pixels
        if not m.images:
            out.append(m)
            continue
        shown: list[ImageRef] = []
        lines: list[str] = []
        for image in m.images:
            got = await reads.get(image) if vision else NO_VISION
            if isinstance(got, bytes) and (sent_count >= max_images or sent_bytes + len(got) > max_bytes):
                got = "shown earlier; not sent again"
            if isinstance(got, bytes):
                sent_count, sent_bytes = sent_count + 1, sent_bytes + len(got)
                shown.append(dataclasses.replace(image, data=got))
            else:
                lines.append(image.described(got))
        content = "\n".join([m.content, *lines]) if m.content and lines else m.content or "\n".join(lines)
        out.append(dataclasses.replace(m, content=content, images=tuple(shown)))
    return dataclasses.replace(request, messages=out[::-1])
