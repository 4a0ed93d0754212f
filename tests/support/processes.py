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


def children_of(pid: int) -> list[int]:
    """Pids whose parent is `pid`."""
    found = []
    for child in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{child}/stat") as f:
                # "pid (comm) state ppid ...": comm may hold spaces, so split after its ")".
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(child))
    return found


def is_running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
