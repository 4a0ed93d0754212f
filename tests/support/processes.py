"""Looking at the host's processes, to prove a sandboxed program really stopped."""

from __future__ import annotations

import os


def processes_running(needle: str) -> list[int]:
    """Pids whose command line contains `needle`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if needle.encode() in f.read().replace(b"\0", b" "):
                    found.append(int(pid))
        except OSError:
            continue
    return found
