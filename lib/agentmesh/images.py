"""Images in messages, for every service: what an image is by reference, how its kind and size
are read from its bytes, where its one stored copy lives, and how it is described in words.

An image is stored once, as a file of the session's workspace under `.attachments/`, named by
the SHA-256 of its bytes (the same picture attached twice is one file); messages and tool
results hold an `ImageRef` to it. The bytes are read back only when a model request is built.
Kinds are read from the bytes (the magic numbers), never trusted from a name or a header.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Protocol, Sequence, TypeVar

from agentmesh.errors import InvalidArgument

__all__ = [
    "ATTACHMENTS_DIR",
    "MEDIA_TYPES",
    "ImageRef",
    "attachment_path",
    "describe",
    "image_info",
    "media_type_of",
    "validate_images",
    "validate_references",
]

ATTACHMENTS_DIR = ".attachments"
# The kinds both OpenAI-compatible servers and Anthropic take, with their file extensions.
MEDIA_TYPES = {"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp"}
_NAMES = {"image/png": "PNG", "image/jpeg": "JPEG", "image/gif": "GIF", "image/webp": "WebP"}


@dataclass(frozen=True)
class ImageRef:
    """One image of a message or a tool result. `path`: its stored copy, relative to the session's
    workspace. `data` is empty except in a model request being built (the loop reads it then)."""

    path: str
    media_type: str
    name: str = ""
    width: int = 0
    height: int = 0
    size_bytes: int = 0
    data: bytes = b""

    def described(self, why: str = "") -> str:
        return describe(self, why)


def media_type_of(data: bytes) -> str:
    """The image kind the bytes are, from their first bytes; "" when none of MEDIA_TYPES."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return ""


def _jpeg_size(data: bytes) -> tuple[int, int]:
    # Walk the segments to the first start-of-frame marker, which holds height then width.
    i = 2
    while i + 9 < len(data):
        if data[i] != 0xFF:
            return 0, 0
        marker = data[i + 1]
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        length = struct.unpack(">H", data[i + 2:i + 4])[0]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            height, width = struct.unpack(">HH", data[i + 5:i + 9])
            return width, height
        i += 2 + length
    return 0, 0


def _webp_size(data: bytes) -> tuple[int, int]:
    chunk = data[12:16]
    if chunk == b"VP8X" and len(data) >= 30:
        return 1 + int.from_bytes(data[24:27], "little"), 1 + int.from_bytes(data[27:30], "little")
    if chunk == b"VP8L" and len(data) >= 25:
        bits = int.from_bytes(data[21:25], "little")
        return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
    if chunk == b"VP8 " and len(data) >= 30:
        width, height = struct.unpack("<HH", data[26:30])
        return width & 0x3FFF, height & 0x3FFF
    return 0, 0


def image_info(data: bytes) -> tuple[str, int, int]:
    """(media type, width, height) of the bytes; ("", 0, 0) when they are no image we take.
    A size that cannot be read is 0 × 0: placeholders then leave it out."""
    kind = media_type_of(data)
    try:
        if kind == "image/png" and len(data) >= 24:
            width, height = struct.unpack(">II", data[16:24])
            return kind, width, height
        if kind == "image/gif" and len(data) >= 10:
            width, height = struct.unpack("<HH", data[6:10])
            return kind, width, height
        if kind == "image/jpeg":
            return (kind, *_jpeg_size(data))
        if kind == "image/webp":
            return (kind, *_webp_size(data))
    except struct.error:
        pass
    return kind, 0, 0


def attachment_path(data: bytes, media_type: str) -> str:
    """Where the bytes' one copy lives in a workspace: the same bytes, the same path."""
    digest = hashlib.sha256(data).hexdigest()[:32]
    return f"{ATTACHMENTS_DIR}/{digest}.{MEDIA_TYPES.get(media_type, 'bin')}"


def describe(image: ImageRef, why: str = "") -> str:
    """The one line that stands for an image where its pixels cannot go: a model that takes no
    images, a compaction summary, a reflection. `why`: what follows the dash, if anything."""
    parts = [image.name or image.path.rsplit("/", 1)[-1] or "image"]
    if image.width and image.height:
        parts.append(f"{image.width}×{image.height} {_NAMES.get(image.media_type, image.media_type)}")
    else:
        parts.append(_NAMES.get(image.media_type, image.media_type or "unknown kind"))
    return f"[image: {', '.join(parts)}{' — ' + why if why else ''}]"


class _Given(Protocol):
    @property
    def data(self) -> bytes: ...
    @property
    def path(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def media_type(self) -> str: ...


_G = TypeVar("_G", bound=_Given)
_MAX_NAME_CHARS = 200
_MAX_PATH_CHARS = 1000


def validate_images(images: Sequence[_G], *, max_count: int, max_bytes: int, max_total_bytes: int = 0,
                    settings: str = "") -> Sequence[_G]:
    """The images of a chat request, checked: at most `max_count`, each either bytes of a kind we
    take (at most `max_bytes`) or a workspace path, the bytes together at most `max_total_bytes`
    (0: no bound of its own). Raises InvalidArgument naming the image and the limit; `settings`
    names the variables that set the limits, for the sentence."""
    where = f" ({settings})" if settings else ""
    if len(images) > max_count:
        raise InvalidArgument(f"images holds {len(images)} images; at most {max_count} go with one message{where}")
    total = 0
    for index, image in enumerate(images):
        at = f"images[{index}]"
        if bool(image.data) == bool(image.path):
            raise InvalidArgument(f"{at}: give either the image's bytes (data) or the path of an image file in the "
                                  "session's workspace (path), not both or neither")
        if len(image.name) > _MAX_NAME_CHARS or len(image.path) > _MAX_PATH_CHARS:
            raise InvalidArgument(f"{at}: name is limited to {_MAX_NAME_CHARS} characters and path to {_MAX_PATH_CHARS}")
        if image.media_type and image.media_type not in MEDIA_TYPES:
            raise InvalidArgument(f"{at}: media_type {image.media_type[:60]!r} is not one of {', '.join(MEDIA_TYPES)}")
        if not image.data:
            continue
        if len(image.data) > max_bytes:
            raise InvalidArgument(f"{at} is {len(image.data)} bytes; an image may be at most {max_bytes} bytes{where}")
        kind = media_type_of(image.data)
        if not kind:
            raise InvalidArgument(f"{at} is not a PNG, JPEG, GIF or WebP image (its bytes are none of those)")
        if image.media_type and image.media_type != kind:
            raise InvalidArgument(f"{at}: media_type says {image.media_type} but the bytes are {kind}")
        total += len(image.data)
        if max_total_bytes and total > max_total_bytes:
            raise InvalidArgument(f"the images of one message may be at most {max_total_bytes} bytes together; "
                                  f"these are more{where}")
    return images


def validate_references(paths: Sequence[str], where: str, *, max_count: int) -> None:
    """Stored images (a transcript's): references to files under ATTACHMENTS_DIR, never bytes
    (whoever sends bytes sends an empty path). Raises InvalidArgument saying so."""
    if len(paths) > max_count:
        raise InvalidArgument(f"{where}: at most {max_count} images per message, got {len(paths)}")
    if any(not path.startswith(ATTACHMENTS_DIR + "/") for path in paths):
        raise InvalidArgument(f"{where}: an image is stored by reference: its path must be under {ATTACHMENTS_DIR}/ "
                              "in the session's workspace, and its bytes are not sent")
