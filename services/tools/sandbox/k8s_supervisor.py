"""A session pod's supervisor: session_supervisor.py run through ONE long-lived `pods/exec`
stream per pod (and tools replica), its JSON lines on the stream's stdin and stdout.

Opening an exec costs a round trip through the API server to the kubelet and the runtime (some
0.6–1.3 s on the image tests' podman kubelet); a message on an open stream costs a round trip.
So the session's first call opens the stream, and every later call is one request on it (the
protocol of a local session jail: supervisor_link.py), its process started by the supervisor in
the pod, calls multiplexed by their ids. The `python` tool's cells run in the supervisor's
persistent interpreter, as locally.

The lifeline. The tools service only ever writes requests to the stream. When the stream ends —
the tools service closes it, dies, or loses its connection — the runtime closes the
supervisor's stdin, and the supervisor kills every running call's process group and the
interpreter before it exits (session_supervisor.Supervisor.serve). When the pod goes away under
the stream (deleted, evicted, its node lost), the stream ends and every call waiting on it gets
`JailGone` at once.

The websocket client is synchronous: a thread per stream reads it (`update` waits on the
socket, so a reply is handed over as soon as it arrives) and passes whole lines to the event
loop; requests are written from the event loop (websocket-client's sends hold a lock).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket as sockets
import threading
from typing import Any

from kubernetes.stream.ws_client import WSClient

from agentmesh.logs import get_logger
from agentmesh.tools.sandbox.k8s_api import KubernetesJobs
from agentmesh.tools.sandbox.k8s_job import CONTAINER
from agentmesh.tools.sandbox.supervisor_link import BOOT, SUPERVISOR_SOURCE, SupervisorLink

__all__ = ["SUPERVISOR_COMMAND", "PodSupervisor"]

log = get_logger("agentmesh.tools.kubernetes.session")

SUPERVISOR_COMMAND = ["python3", "-I", "-c", BOOT]
STDOUT, STDERR, ERROR = 1, 2, 3
# How often the reading thread looks whether the stream is to be closed (replies never wait on it).
POLL_S = 0.25
STDERR_KEEP = 4096


class PodSupervisor:
    """The supervisor of one session pod, as this tools replica reaches it."""

    def __init__(self, pod: str, line_limit: int, container: str = CONTAINER):
        self.pod = pod
        self.container = container  # ours: CONTAINER; an agent-sandbox pod's: its first (agent_sandbox.py)
        self.link = SupervisorLink(self._write)
        # The supervisor's id of each running exec call, by the call's own id (for `peek`).
        self.calls: dict[str, int] = {}
        self.stderr = b""
        # The API server's Status when the stream ended ({}: the stream broke with none).
        self.status: dict[str, Any] = {}
        self._line_limit = line_limit
        self._socket: WSClient | None = None
        self._stop = threading.Event()

    @property
    def open(self) -> bool:
        return self.link.open

    async def start(self, api: KubernetesJobs) -> None:
        """Open the stream and boot the supervisor; raises KubeApiError when the pod refuses it."""
        connecting = asyncio.ensure_future(api.exec(self.pod, self.container, SUPERVISOR_COMMAND))
        try:
            self._socket = await asyncio.shield(connecting)
        except asyncio.CancelledError:
            connecting.add_done_callback(_close_late)  # a stream opened after the cancel is closed at once
            raise
        self._write((json.dumps(SUPERVISOR_SOURCE) + "\n").encode())
        loop = asyncio.get_running_loop()
        threading.Thread(target=self._read, args=(loop,), name=f"supervisor-{self.pod}", daemon=True).start()

    def _write(self, line: bytes) -> None:
        if self._socket is None or not self._socket.is_open():
            raise OSError("the session pod's supervisor stream is closed")
        self._socket.write_channel(0, line)

    def _read(self, loop: asyncio.AbstractEventLoop) -> None:
        socket = self._socket
        assert socket is not None
        pending = b""
        error = b""
        unreadable = False
        try:
            while socket.is_open() and not self._stop.is_set():
                socket.update(timeout=POLL_S)
                said = socket.read_channel(STDERR)
                if said and len(self.stderr) < STDERR_KEEP:
                    self.stderr += said[: STDERR_KEEP - len(self.stderr)]
                data = socket.read_channel(STDOUT)
                if not data:
                    continue
                *lines, pending = (pending + data).split(b"\n")
                if lines:
                    loop.call_soon_threadsafe(self._deliver, lines)
                if len(pending) > self._line_limit:
                    # A reply holds two capped streams, JSON-escaped: a longer line is not the
                    # supervisor's (a program took its place), and ends the stream.
                    unreadable = True
                    break
            error = socket.read_channel(ERROR) or b""
        except Exception:  # noqa: BLE001 - a broken stream ends the link; the calls on it say so
            pass
        finally:
            with contextlib.suppress(Exception):
                socket.close()
        status: dict[str, Any] = {}
        with contextlib.suppress(ValueError):
            parsed = json.loads(error) if error else {}
            status = parsed if isinstance(parsed, dict) else {}
        if unreadable:
            log.warning("a session pod's supervisor sent an unreadable reply; ending its stream", pod=self.pod)
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(self._ended, status)

    def _deliver(self, lines: list[bytes]) -> None:
        for line in lines:
            try:
                self.link.receive(line)
            except (ValueError, AttributeError) as exc:  # not JSON, not an object
                log.warning("a session pod's supervisor sent an unreadable reply; ending its stream", pod=self.pod,
                            error=str(exc))
                self.close()
                return

    def _ended(self, status: dict[str, Any]) -> None:
        self.status = status
        self.link.end()

    def close(self) -> None:
        """End the stream (the supervisor then kills its calls and exits); the calls waiting on
        it get JailGone at once."""
        self._stop.set()
        socket = self._socket
        if socket is not None:
            # Wakes the reading thread's wait on the socket; it closes the stream.
            with contextlib.suppress(Exception):
                socket.sock.sock.shutdown(sockets.SHUT_RDWR)
        self.link.end()


def _close_late(connecting: asyncio.Future[Any]) -> None:
    if not connecting.cancelled() and connecting.exception() is None:
        with contextlib.suppress(Exception):
            connecting.result().close()
