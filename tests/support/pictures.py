"""Small, real image files for tests: a PNG of any size, made with zlib as the format says."""

from __future__ import annotations

import struct
import zlib


def png(width: int = 4, height: int = 3, shade: int = 0) -> bytes:
    """A grey PNG; `shade` makes a different picture (different bytes) of the same size."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    rows = b"".join(b"\x00" + bytes([shade % 256]) * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit greyscale
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
