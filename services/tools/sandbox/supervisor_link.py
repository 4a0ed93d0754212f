"""The tools service's side of the session supervisor's protocol (session_supervisor.py): JSON
requests out, JSON replies in, one a line, each reply matched to its request by id.

It does not care what carries the lines: a local session jail's stdin and stdout pipes
(session_jail.py) or one exec stream into a session pod (k8s_supervisor.py). The carrier gives
`send` (one line, written at once) and feeds each line it reads to `receive`; when it ends it
calls `end`, which answers every request still waiting with `JailGone`. The waiting for a
reply — a call's timeout, the stop it then gets, the grace the supervisor has to answer it — and
the reading of a reply are here too, the same for both.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

from agentmesh.tools.sandbox.base import CellResult, CommandResult, CommandSpec

__all__ = [
    "BOOT",
    "INTERRUPT_GRACE_S",
    "KILL_GRACE_S",
    "SUPERVISOR_SOURCE",
    "JailGone",
    "SupervisorLink",
    "cell_details",
    "cell_reply",
    "last_word",
    "reply_result",
]

# The supervisor's program: its parts as one text, the supervisor's own last (it runs them).
SUPERVISOR_SOURCE = "\n".join(Path(__file__).with_name(f"session_{part}.py").read_text()
                              for part in ("common", "kernel", "spawner", "supervisor"))
# The supervisor's whole command line; mirrors session_supervisor.BOOT (that module is the
# sandbox's program, not imported here): its text is the first line of its stdin, so the jail or
# the pod's image needs nothing of agentmesh, only a python3.
BOOT = ("import json, sys; SOURCE = json.loads(sys.stdin.buffer.readline()); "
        "exec(compile(SOURCE, 'session_supervisor', 'exec'), {'__name__': '__main__', 'SOURCE': SOURCE})")
# After a timeout's SIGINT, how long the cell has to stop before the interpreter is ended.
INTERRUPT_GRACE_S = 2.0
# After a kill, how long the supervisor has to report the call's end.
KILL_GRACE_S = 2.0


class JailGone(Exception):
    """The session's sandbox (its jail, or its pod's supervisor) ended while a call was in flight."""


class SupervisorLink:
    def __init__(self, send: Callable[[bytes], None]):
        self._send_line = send
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._next_id = 0
        self.ended = asyncio.Event()

    @property
    def open(self) -> bool:
        return not self.ended.is_set()

    def receive(self, line: bytes) -> None:
        """One line from the supervisor; raises ValueError or AttributeError for one that is not
        a JSON object (the carrier then ends the sandbox: the programs may have replaced it)."""
        message = json.loads(line)
        future = self._pending.pop(message.get("id"), None)
        if future is not None and not future.done():
            future.set_result(message)

    def end(self) -> None:
        self.ended.set()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(JailGone())
                # Its caller may have stopped waiting (cancelled): the exception is then nobody's.
                future.add_done_callback(lambda done: done.exception())
        self._pending.clear()

    def _send(self, message: dict[str, Any]) -> None:
        if not self.open:
            raise JailGone()
        try:
            self._send_line((json.dumps(message) + "\n").encode())
        except (OSError, ValueError) as exc:  # the pipe or the stream broke under the write
            raise JailGone() from exc

    def request(self, message: dict[str, Any]) -> tuple[int, asyncio.Future[dict[str, Any]]]:
        """Send `message` with a new id; the future is its reply."""
        self._next_id += 1
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[self._next_id] = future
        try:
            self._send({**message, "id": self._next_id})
        except JailGone:
            self._pending.pop(self._next_id)
            raise
        return self._next_id, future

    def signal(self, op: str, call: int) -> None:
        """`kill`, `interrupt` or `restart` for request `call`; nothing when the sandbox is gone."""
        with contextlib.suppress(JailGone, ConnectionError):
            self._send({"op": op, "id": call})

    async def reply(self, call: int, future: asyncio.Future[dict[str, Any]], timeout_s: float, stop: str,
                    grace_s: float) -> dict[str, Any]:
        """The reply of `call`; on timeout (when `grace_s`, the stop then has a grace to answer)
        or cancellation the call is stopped with `stop` first."""
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except asyncio.CancelledError:
            self.signal(stop, call)
            raise
        except TimeoutError:
            if grace_s:
                self.signal(stop, call)
            raise


async def last_word(link: SupervisorLink, call: int, future: asyncio.Future[dict[str, Any]], stop: str,
                    end_sandbox: Callable[[], Awaitable[None]]) -> dict[str, Any]:
    """The reply of a call that was told to stop; when the supervisor does not give it within
    KILL_GRACE_S (a program stopped or took over the supervisor: it runs as the same user), the
    sandbox is ended (`end_sandbox`), which answers every call in it."""
    try:
        return await link.reply(call, future, KILL_GRACE_S, stop, 0)
    except TimeoutError:
        await end_sandbox()
        return {"exit_code": -9, "stdout": "", "stderr": "", "truncated": False, "kernel_lost": True}


async def cell_reply(link: SupervisorLink, call: int, future: asyncio.Future[dict[str, Any]], timeout_s: float,
                     end_sandbox: Callable[[], Awaitable[None]]) -> tuple[dict[str, Any], bool]:
    """A cell's reply, and whether its time ran out: then it is interrupted (SIGINT), and when it
    does not give way within INTERRUPT_GRACE_S (a C extension's loop) the interpreter is ended."""
    try:
        return await link.reply(call, future, timeout_s, "interrupt", INTERRUPT_GRACE_S), False
    except TimeoutError:
        pass
    try:
        return await link.reply(call, future, INTERRUPT_GRACE_S, "interrupt", 0), True
    except TimeoutError:
        link.signal("restart", 0)
        return await last_word(link, call, future, "restart", end_sandbox), True


def reply_result(reply: dict[str, Any], started: float) -> CommandResult:
    """A call's result as the supervisor reported it. The supervisor shares the sandbox with the
    programs (they may have replaced it): every field is checked for its type, and a missing or
    odd one reads as nothing."""
    def field(name: str, kind: type, default: Any) -> Any:
        value = reply.get(name, default)
        return value if type(value) is kind else default  # exactly: a bool is an int too

    result = CommandResult(exit_code=field("exit_code", int, -1), stdout=field("stdout", str, ""),
                           stderr=field("stderr", str, ""), truncated=field("truncated", bool, False),
                           duration_ms=(time.monotonic() - started) * 1000)
    if field("failed", bool, False):  # the supervisor's own error, its sentence in stderr
        result.error_kind = "sandbox_error"
        result.detail = "the session sandbox could not run the call; it stays, and a later call may run"
    return result


def cell_details(result: CommandResult, reply: dict[str, Any], spec: CommandSpec, timed_out: bool) -> CellResult:
    """A cell's outcome: what stopped it, said for the model (a disk quota is said already)."""
    if result.error_kind == "disk_quota":
        pass  # the interpreter keeps its variables
    elif timed_out:
        result.detail = (f"the cell ran past its {spec.timeout_s:g} s time limit and was interrupted"
                         + ("; the interpreter had to be restarted, so its variables are gone"
                            if reply.get("kernel_lost") else "; the interpreter keeps its variables"))
    elif reply.get("cpu_limit"):
        result.error_kind = "cpu_limit"
        result.detail = "the cell was stopped by the sandbox's CPU time limit; the interpreter keeps its variables"
    elif reply.get("kernel_lost"):
        result.error_kind = result.error_kind or "kernel_lost"
        result.detail = result.detail or ("the Python interpreter ended during the cell (a limit or a crash); "
                                          "its variables are gone and the next call starts a fresh one")
    figures = reply.get("figures")
    figures = [f for f in figures if isinstance(f, str)] if isinstance(figures, list) else []
    tables = reply.get("tables")
    tables = [t for t in tables if isinstance(t, str)] if isinstance(tables, list) else []
    return CellResult(result, figures, bool(reply.get("interrupted")), bool(reply.get("kernel_lost")), tables)
