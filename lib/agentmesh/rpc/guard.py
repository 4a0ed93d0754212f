"""Requests that are not protobuf at all: answered INVALID_ARGUMENT, never a traceback.

grpc.aio decodes the request before the servicer runs; a decoder that raises is logged as an
"Unexpected error" with its traceback and answered UNKNOWN. Here the decoder's failure becomes
a marker, and the method answers INVALID_ARGUMENT with the message type it expected (the
server's call interceptor, calls.py, does both).
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["MALFORMED", "lenient", "malformed_message"]


class _Malformed:
    __slots__ = ()


MALFORMED = _Malformed()


def _type_name(deserializer: Callable[[bytes], Any] | None) -> str:
    owner = getattr(deserializer, "__self__", None)
    descriptor = getattr(owner, "DESCRIPTOR", None)
    return getattr(descriptor, "full_name", "") or "protobuf"


def malformed_message(deserializer: Callable[[bytes], Any] | None) -> str:
    """What a caller whose bytes do not decode is told."""
    return (f"the request is not a valid {_type_name(deserializer)} message "
            f"(the bytes do not decode as protobuf)")


def lenient(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any]:
    """`deserializer`, returning MALFORMED instead of raising (calls.py answers it)."""

    def decode(raw: bytes) -> Any:
        if deserializer is None:
            return raw
        try:
            return deserializer(raw)
        except Exception:  # noqa: BLE001 - any decoding failure is the caller's bad bytes
            return MALFORMED

    return decode
