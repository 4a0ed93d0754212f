"""pods/attach for the tests' Kubernetes API server (fake_kube.py): the websocket the API server
and the kubelet serve, on the connection of the HTTP request that asked for it.

Channel-prefixed binary frames — `v5.channel.k8s.io`, or `v4` for a client (or a FakeKube whose
`attach_protocols` says so) without v5: 0 stdin, 1 stdout, 2 stderr; v5 adds 255 to close a
channel. The container's output is sent from the moment of attaching on; with `stdinOnce` the
container's stdin closes when the attach ends. Websocket framing is wsproto's.
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


def serve_attach(fake: FakeKube, handler, parts, query) -> None:
    """pods/attach over a websocket, as the API server and kubelet serve it: channel-prefixed
    binary frames (v5.channel.k8s.io, or v4), 0 stdin, 1 stdout, 2 stderr; v5 adds 255 to close
    a channel. Output from the moment of attaching on; with `stdinOnce` the container's stdin
    closes when the attach ends."""
    key = (parts[3], parts[5])
    offered = [p.strip() for p in handler.headers.get("Sec-WebSocket-Protocol", "").split(",")]
    protocol = next((p for p in fake.attach_protocols if p in offered), None)
    if handler.headers.get("Upgrade", "").lower() != "websocket" or not handler.headers.get("Sec-WebSocket-Key"):
        fake.answer(handler, 400, status_body(400, "BadRequest", "Upgrade request required"))
        return
    if protocol is None:
        fake.answer(handler, 400, status_body(400, "BadRequest", f"no supported channel subprotocol in {offered}"))
        return
    with fake.cond:
        pod = fake.pods.get(key)
        proc = fake.procs.get(key)
    if pod is None:
        fake.answer(handler, 404, status_body(404, "NotFound", f'pods "{parts[5]}" not found'))
        return
    container = pod["spec"]["containers"][0]
    if query.get("container", container["name"]) != container["name"]:
        fake.answer(handler, 400, status_body(400, "BadRequest", f"container {query['container']} is not valid for pod {parts[5]}"))
        return
    if query.get("stdin") in ("true", "1") and not container.get("stdin"):
        fake.answer(handler, 400, status_body(400, "BadRequest", f"container {container['name']} in pod {parts[5]} does not have stdin enabled"))
        return
    if proc is None or proc.poll() is not None:
        phase = pod["status"].get("phase", "Pending")
        message = (f"cannot attach a container in a completed pod; current phase is {phase}" if phase in ("Succeeded", "Failed")
                   else f'container "{container["name"]}" in pod "{parts[5]}" is waiting to start')
        fake.answer(handler, 400, status_body(400, "BadRequest", message))
        return
    accept = base64.b64encode(hashlib.sha1((handler.headers["Sec-WebSocket-Key"] + WEBSOCKET_GUID).encode()).digest()).decode()
    handler.send_response(101, "Switching Protocols")
    handler.send_header("Upgrade", "websocket")
    handler.send_header("Connection", "Upgrade")
    handler.send_header("Sec-WebSocket-Accept", accept)
    handler.send_header("Sec-WebSocket-Protocol", protocol)
    handler.end_headers()
    handler.wfile.flush()
    handler.close_connection = True
    fake.attaches.append(protocol)
    AttachSession(fake, key, proc, container, protocol, handler).run()


class AttachSession:
    """One attached websocket: frames from the client to the container's stdin, its output to the client."""

    def __init__(self, fake: FakeKube, key: tuple[str, str], proc: subprocess.Popen, container: dict, protocol: str, handler):
        self.fake = fake
        self.key = key
        self.proc = proc
        self.stdin_once = bool(container.get("stdinOnce"))
        self.v5 = protocol.startswith("v5")
        self.socket = handler.connection
        self.reader = handler.rfile
        self.ws = wsproto.connection.Connection(wsproto.connection.ConnectionType.SERVER)
        self.lock = threading.Lock()
        self.open = True

    def run(self) -> None:
        with self.fake.cond:
            self.fake.attached.setdefault(self.key, []).append(self.deliver)
        if self.proc.poll() is not None and self.key not in self.fake.procs:
            self.deliver(None, b"")
        message = b""
        try:
            while self.open:
                data = self.reader.read1(65536)
                if not data:
                    break
                with self.lock:  # wsproto is not thread-safe; output is sent from the container's threads
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
        finally:
            self.open = False
            with self.fake.cond:
                sinks = self.fake.attached.get(self.key, [])
                if self.deliver in sinks:
                    sinks.remove(self.deliver)
            if self.stdin_once:
                self.close_stdin()

    def from_client(self, message: bytes) -> None:
        if not message:
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
            self.proc.stdin.close()
        except (OSError, ValueError):
            pass

    def deliver(self, channel: int | None, data: bytes) -> None:
        """Output for the client; None: the container ended, so the stream does."""
        if channel is None:
            self.send(wsproto.events.CloseConnection(code=1000))
            self.open = False
            try:
                self.socket.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        self.send(wsproto.events.BytesMessage(data=bytes([channel]) + data))

    def send(self, event) -> None:
        with self.lock:
            try:
                self.socket.sendall(self.ws.send(event))
            except (OSError, wsproto.utilities.LocalProtocolError):
                self.open = False
