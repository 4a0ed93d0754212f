"""Looking at the host's processes, to prove a sandboxed program really stopped.

Only this test process's own descendants count: the machine may be running other test sessions
at the same time (other checkouts, other pytest-xdist workers), with the same commands of their
own. A jail's processes stay below the service that started it (their PID namespace still shows
the host's parent chain, and they die with the namespace's init)."""

from __future__ import annotations

import os


def descendants(root: int | None = None) -> set[int]:
    """The processes below `root` (default: this process) now, by the parent each one names in /proc."""
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # ended while we looked
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")".
        children.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(int(entry))
    found: set[int] = set()
    frontier = [os.getpid() if root is None else root]
    while frontier:
        for child in children.get(frontier.pop(), []):
            if child not in found:
                found.add(child)
                frontier.append(child)
    return found


def processes_running(needle: str) -> list[int]:
    """This test's descendants whose command line contains `needle`."""
    found = []
    for pid in sorted(descendants()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if needle.encode() in f.read().replace(b"\0", b" "):
                    found.append(pid)
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
