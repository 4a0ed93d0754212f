"""The parts of the session supervisor's program (session_supervisor.py) that all of them use:
the reply pipe, capped output, the rlimits a started process gets, BOOT.

Standard library only: see session_supervisor.py for how the parts become one program."""

import json
import os
import resource
import signal
import threading

WRITE_LOCK = threading.Lock()


def reply(message):
    line = (json.dumps(message) + "\n").encode()
    with WRITE_LOCK:
        os.write(1, line)


class Capped:
    """What the model sees of one stream: as output.CappedOutput (this file imports nothing of
    agentmesh), three quarters of `cap` from the start and a quarter from the end, around a marker
    that says how much was left out."""

    def __init__(self, cap):
        self.cap = cap
        self.head_cap = cap - cap // 4
        self.tail_cap = cap // 4
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk):
        self.total += len(chunk)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk and self.tail_cap:
            self.tail += chunk
            if len(self.tail) > 2 * self.tail_cap:
                del self.tail[: len(self.tail) - self.tail_cap]

    @property
    def truncated(self):
        return self.total > self.cap

    def text(self):
        if not self.truncated:
            return (bytes(self.head) + bytes(self.tail)).decode("utf-8", "replace")
        tail = bytes(self.tail[-self.tail_cap:]) if self.tail_cap else b""
        dropped = self.total - len(self.head) - len(tail)
        marker = f"\n[... {dropped} bytes of output truncated ({self.total} bytes in all) ...]\n"
        return bytes(self.head).decode("utf-8", "replace") + marker + tail.decode("utf-8", "replace")


def set_limits(limits):
    """In a child between fork and exec (a spawner, the kernel, a call forked from here): the
    limits a per-call jail sets with prlimit (local.rlimit_prefix); CPU soft below hard: SIGXCPU
    first (the CPU limit), SIGKILL a second later. The kernel's request has no CPU entry: its CPU
    limit is per cell (Kernel.execute).

    A preexec function is unsafe in a threaded program when the child needs a lock another
    thread held at the fork; this one only calls setrlimit, and the supervisor's other threads
    hold no lock but the GIL (which the forking thread has)."""
    if "cpu" in limits:
        resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu"], limits["cpu"] + 1))
    # A pod's supervisor is sent no "as" or "nproc" (its cgroup bounds memory and processes; an
    # RLIMIT_NPROC there would count every container of the node running as the same uid).
    for name, which in (("as", resource.RLIMIT_AS), ("nproc", resource.RLIMIT_NPROC), ("fsize", resource.RLIMIT_FSIZE)):
        if name in limits:
            resource.setrlimit(which, (limits[name], limits[name]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def call_env(request):
    """A call's environment: exactly the request's (a jail's is built by the service), or with
    `"inherit_env": true` the supervisor's own with the request's on top (a pod's: the image's
    and the pod spec's variables, which the service does not know)."""
    return {**os.environ, **request["env"]} if request.get("inherit_env") else request["env"]


def kill_group(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# The whole command line of the supervisor and of the kernel: read this file's text (one JSON
# string) from stdin and run it as __main__, with SOURCE set to it.
BOOT = ("import json, sys; SOURCE = json.loads(sys.stdin.buffer.readline()); "
        "exec(compile(SOURCE, 'session_supervisor', 'exec'), {'__name__': '__main__', 'SOURCE': SOURCE})")
