"""Bounded capture of a program's output: the head and the tail kept, the middle counted and dropped."""

from __future__ import annotations


class CappedOutput:
    """Keeps at most `cap` bytes: three quarters from the start, a quarter from the end.

    Errors tend to be at the end of a long output and context at the start, so the model sees
    both around a marker that says how much was left out.
    """

    def __init__(self, cap: int):
        self.cap = cap
        self._head_cap = cap - cap // 4
        self._tail_cap = cap // 4
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self._head_cap - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if chunk and self._tail_cap:
            self._tail += chunk
            if len(self._tail) > 2 * self._tail_cap:
                del self._tail[: len(self._tail) - self._tail_cap]

    @property
    def truncated(self) -> bool:
        return self.total > self.cap

    def text(self) -> str:
        if not self.truncated:
            return (bytes(self._head) + bytes(self._tail)).decode("utf-8", errors="replace")
        tail = bytes(self._tail[-self._tail_cap :]) if self._tail_cap else b""
        dropped = self.total - len(self._head) - len(tail)
        marker = f"\n[... {dropped} bytes of output truncated ({self.total} bytes in all) ...]\n"
        return (
            bytes(self._head).decode("utf-8", errors="replace")
            + marker
            + tail.decode("utf-8", errors="replace")
        )
