"""The websocket side shared by pods/exec and pods/attach of the tests' Kubernetes API server
(fake_kube_exec.py, fake_kube_attach.py): the upgrade handshake on the HTTP request's connection
and the channel stream over it.

Channel-prefixed binary frames — `v5.channel.k8s.io`, or `v4` for a client (or a FakeKube whose
`attach_protocols` says so) without v5: 0 stdin, 1 stdout, 2 stderr; v5 adds 255 to close a
channel. Websocket framing is wsproto's.
"""

from __future__ import annotations

import base64
import hashlib
import socket
import subprocess
import threading

import wsproto.connection
import wsproto.events
import wsproto.utilities

from tests.tools.fake_kube import FakeKube, status_body

WEBSOCKET_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455


def channel_protocol(fake: FakeKube, handler) -> str | None:
    """The subprotocol both sides speak, or None once the request has been answered 400."""
    offered = [p.strip() for p in handler.headers.get("Sec-WebSocket-Protocol", "").split(",")]
    protocol = next((p for p in fake.attach_protocols if p in offered), None)
    if handler.headers.get("Upgrade", "").lower() != "websocket" or not handler.headers.get("Sec-WebSocket-Key"):
        fake.answer(handler, 400, status_body(400, "BadRequest", "Upgrade request required"))
        return None
    if protocol is None:
        fake.answer(handler, 400, status_body(400, "BadRequest", f"no supported channel subprotocol in {offered}"))
        return None
    return protocol


def switch_protocols(handler, protocol: str) -> None:
    accept = base64.b64encode(hashlib.sha1((handler.headers["Sec-WebSocket-Key"] + WEBSOCKET_GUID).encode()).digest()).decode()
    handler.send_response(101, "Switching Protocols")
    handler.send_header("Upgrade", "websocket")
    handler.send_header("Connection", "Upgrade")
    handler.send_header("Sec-WebSocket-Accept", accept)
    handler.send_header("Sec-WebSocket-Protocol", protocol)
    handler.end_headers()
    handler.wfile.flush()
    handler.close_connection = True


class ChannelSession:
    """One channel websocket to a process: frames from the client to its stdin, output back."""

    def __init__(self, fake: FakeKube, key: tuple[str, str], protocol: str, handler):
        self.fake = fake
        self.key = key
        self.v5 = protocol.startswith("v5")
        self.socket = handler.connection
        self.reader = handler.rfile
        self.ws = wsproto.connection.Connection(wsproto.connection.ConnectionType.SERVER)
        self.lock = threading.Lock()
        self.open = True
        self.proc: subprocess.Popen | None = None

    def receive(self) -> None:
        """Read the client's frames until it closes or the stream ends."""
        message = b""
        try:
            while self.open:
                data = self.reader.read1(65536)
                if not data:
                    break
                with self.lock:  # wsproto is not thread-safe; output is sent from the process's threads
                    self.ws.receive_data(data)
                    events = list(self.ws.events())
                for event in events:
                    if isinstance(event, wsproto.events.BytesMessage):
                        message += bytes(event.data)
                        if event.message_finished:
                            self.from_client(message)
                            message = b""
                    elif isinstance(event, wsproto.events.Ping):
                        self.send(event.response())
                    elif isinstance(event, wsproto.events.CloseConnection):
                        if self.ws.state == wsproto.connection.ConnectionState.REMOTE_CLOSING:
                            self.send(event.response())
                        self.open = False
        except (OSError, wsproto.utilities.LocalProtocolError, wsproto.utilities.RemoteProtocolError):
            pass

    def from_client(self, message: bytes) -> None:
        if not message or self.proc is None:
            return
        channel, payload = message[0], message[1:]
        if channel == 0 and payload:
            try:
                self.proc.stdin.write(payload)
                self.proc.stdin.flush()
            except (OSError, ValueError):
                pass
        elif channel == 255 and self.v5 and payload[:1] == b"\x00":
            self.close_stdin()

    def close_stdin(self) -> None:
        try:
            if self.proc is not None:
                self.proc.stdin.close()
        except (OSError, ValueError):
            pass

    def finish(self) -> None:
        """End the stream: a websocket close, then the connection."""
        self.send(wsproto.events.CloseConnection(code=1000))
        self.open = False
        try:
            self.socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def send(self, event) -> None:
        with self.lock:
            try:
                self.socket.sendall(self.ws.send(event))
            except (OSError, wsproto.utilities.LocalProtocolError):
                self.open = False
