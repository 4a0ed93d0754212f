"""Message size limits every server and channel shares. Apart from server.py so that a plain
channel (client.py, for the command line) does not import the server's machinery to learn them."""

from __future__ import annotations

__all__ = ["DEFAULT_MAX_RECEIVE_BYTES", "MAX_MESSAGE_BYTES", "MIB"]

MIB = 1024 * 1024
# What a service sends and what its clients accept. What a service *receives* is bounded
# lower, per service, by what its API can take (`max_receive_bytes`).
MAX_MESSAGE_BYTES = 16 * MIB
DEFAULT_MAX_RECEIVE_BYTES = 4 * MIB
