"""Run one child process to its end under a wall clock and an output budget, killing its whole tree.

The child is started in a session of its own, so the default kill (`killpg`) reaches
everything it forked that did not leave the group; the jail passes a killer of its own that ends
its whole PID namespace (see `jail_watch.JailInfo`).

A subprocess protocol (not StreamReaders) collects the output: it sees the exit as soon as it
happens, even while a leftover grandchild still holds the pipes open, and keeps reading (and
dropping) past the cap so a flooding program never blocks on a full pipe before we stop it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping, Sequence, TypeVarTuple, Unpack

from agentmesh.tools.sandbox.output import CappedOutput

# After the program exits, how long output still in flight (or held by a leftover process) is awaited.
PIPE_GRACE_S = 0.5
# The extra arguments a child handler is registered with, passed back to it (as asyncio types them).
_Ts = TypeVarTuple("_Ts")


@dataclass
class ProcessRun:
    returncode: int
    stdout: CappedOutput
    stderr: CappedOutput
    duration_ms: float
    timed_out: bool = False
    output_limit: bool = False

    @property
    def truncated(self) -> bool:
        return self.stdout.truncated or self.stderr.truncated or self.output_limit


class _Collector(asyncio.SubprocessProtocol):
    def __init__(self, loop: asyncio.AbstractEventLoop, cap: int, drain_limit: int):
        self.streams = {1: CappedOutput(cap), 2: CappedOutput(cap)}
        self.drain_limit = drain_limit
        self.received = 0
        self.exited: asyncio.Future[None] = loop.create_future()
        self.over_budget: asyncio.Future[None] = loop.create_future()
        self.pipes_closed: asyncio.Future[None] = loop.create_future()
        self._open = {1, 2}

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        self.received += len(data)
        if self.received > self.drain_limit:
            if not self.over_budget.done():
                self.over_budget.set_result(None)
            return
        self.streams[fd].feed(data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self._open.discard(fd)
        if not self._open and not self.pipes_closed.done():
            self.pipes_closed.set_result(None)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)


class PidfdChildWatcher(asyncio.AbstractChildWatcher):
    """Follows each child through a pidfd on the event loop that started it, as Python 3.12's
    asyncio does by itself. Python 3.11's default (ThreadedChildWatcher) starts a thread per
    child and holds the event loop until that thread runs — per sandboxed call, tenths of a
    millisecond on an idle machine and more under load — then wakes the loop from it. (asyncio's
    own PidfdChildWatcher of 3.11 is tied to one event loop; this one serves whichever runs.)"""

    def add_child_handler(self, pid: int, callback: Callable[[int, int, Unpack[_Ts]], object], *args: *_Ts) -> None:
        loop = asyncio.get_running_loop()
        pidfd = os.pidfd_open(pid)
        loop.add_reader(pidfd, self._reap, loop, pid, pidfd, callback, args)

    @staticmethod
    def _reap(loop: asyncio.AbstractEventLoop, pid: int, pidfd: int, callback: Callable[..., object],
              args: tuple[Any, ...]) -> None:
        loop.remove_reader(pidfd)
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:  # reaped elsewhere: asyncio's convention
            returncode = 255
        else:
            returncode = os.waitstatus_to_exitcode(status)
        os.close(pidfd)
        callback(pid, returncode, *args)

    def remove_child_handler(self, pid: int) -> bool:
        return True

    def attach_loop(self, loop: asyncio.AbstractEventLoop | None) -> None:
        pass

    def is_active(self) -> bool:
        return True

    def close(self) -> None:
        pass

    def __enter__(self) -> "PidfdChildWatcher":
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def follow_children_with_pidfds() -> None:
    """On Python 3.11 with a kernel that has pidfds (Linux 5.3+), follow child processes with
    PidfdChildWatcher instead of a thread each; a no-op where 3.12+ does so already, or where
    pidfds are missing. For the whole process, once."""
    if sys.version_info >= (3, 12) or isinstance(_policy_watcher(), PidfdChildWatcher):
        return
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return
    asyncio.get_event_loop_policy().set_child_watcher(PidfdChildWatcher())


def _policy_watcher() -> object:
    return getattr(asyncio.get_event_loop_policy(), "_watcher", None)


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def _kill_group_async(pid: int) -> None:
    kill_group(pid)


async def run_process(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | None,
    timeout_s: float,
    output_cap: int,
    drain_limit: int,
    preexec_fn: Callable[[], None] | None = None,
    pass_fds: Sequence[int] = (),
    killer: Callable[[int], Awaitable[None]] | None = None,
) -> ProcessRun:
    """Start `argv`, collect capped stdout/stderr, and return when it exits or was killed.

    `killer(pid)` stops the program (default: SIGKILL to its process group). Cancelling the
    awaiting task kills before re-raising, so a cancelled call leaves nothing running.
    """
    kill = killer or _kill_group_async
    follow_children_with_pidfds()
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    spawn = asyncio.ensure_future(
        loop.subprocess_exec(
            lambda: _Collector(loop, output_cap, drain_limit),
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
            preexec_fn=preexec_fn,
            pass_fds=tuple(pass_fds),
        )
    )
    try:
        # Shielded: a cancel that lands while the child is being started must not leave it
        # running unseen; the start completes, then the program is killed like any other.
        transport, collector = await asyncio.shield(spawn)
    except asyncio.CancelledError:
        await asyncio.wait({spawn})
        if not spawn.cancelled() and spawn.exception() is None:
            transport, _ = spawn.result()
            await asyncio.shield(asyncio.ensure_future(kill(transport.get_pid())))
            transport.close()
        raise
    pid = transport.get_pid()
    timed_out = output_limit = False
    try:
        done, _ = await asyncio.wait(
            {collector.exited, collector.over_budget}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        if collector.exited not in done:
            output_limit = collector.over_budget in done
            timed_out = not output_limit
            await kill(pid)
            await collector.exited
        await asyncio.wait({collector.pipes_closed}, timeout=PIPE_GRACE_S)
    except asyncio.CancelledError:
        # Shielded: the program must die even when this task is cancelled once more meanwhile.
        await asyncio.shield(asyncio.ensure_future(kill(pid)))
        raise
    finally:
        # Anything the leader left in its group goes with it (the jail's PID namespace already
        # guarantees this; the unsandboxed mode relies on it).
        kill_group(pid)
        transport.close()
    returncode = transport.get_returncode()
    return ProcessRun(
        returncode=returncode if returncode is not None else -9,
        stdout=collector.streams[1],
        stderr=collector.streams[2],
        duration_ms=(time.monotonic() - started) * 1000,
        timed_out=timed_out,
        output_limit=output_limit,
    )
