"""pods/attach for the tests' Kubernetes API server (fake_kube.py): the websocket the API server
and the kubelet serve, on the connection of the HTTP request that asked for it.

Channel-prefixed binary frames — `v5.channel.k8s.io`, or `v4` for a client (or a FakeKube whose
`attach_protocols` says so) without v5: 0 stdin, 1 stdout, 2 stderr; v5 adds 255 to close a
channel. The container's output is sent from the moment of attaching on; with `stdinOnce` the
container's stdin closes when the attach ends. Websocket framing is wsproto's.
"""

from __future__ import annotations

import subprocess

import wsproto.events

from tests.tools.fake_kube import FakeKube, status_body
from tests.tools.fake_kube_ws import ChannelSession, channel_protocol, switch_protocols


def serve_attach(fake: FakeKube, handler, parts, query) -> None:
    """pods/attach over a websocket, as the API server and kubelet serve it: channel-prefixed
    binary frames (v5.channel.k8s.io, or v4), 0 stdin, 1 stdout, 2 stderr; v5 adds 255 to close
    a channel. Output from the moment of attaching on; with `stdinOnce` the container's stdin
    closes when the attach ends."""
    key = (parts[3], parts[5])
    protocol = channel_protocol(fake, handler)
    if protocol is None:
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
    switch_protocols(handler, protocol)
    fake.attaches.append(protocol)
    AttachSession(fake, key, proc, container, protocol, handler).run()


class AttachSession(ChannelSession):
    """One attached websocket: frames from the client to the container's stdin, its output to the client."""

    def __init__(self, fake: FakeKube, key: tuple[str, str], proc: subprocess.Popen, container: dict, protocol: str, handler):
        super().__init__(fake, key, protocol, handler)
        self.proc = proc
        self.stdin_once = bool(container.get("stdinOnce"))

    def run(self) -> None:
        with self.fake.cond:
            self.fake.attached.setdefault(self.key, []).append(self.deliver)
        if self.proc.poll() is not None and self.key not in self.fake.procs:
            self.deliver(None, b"")
        try:
            self.receive()
        finally:
            self.open = False
            with self.fake.cond:
                sinks = self.fake.attached.get(self.key, [])
                if self.deliver in sinks:
                    sinks.remove(self.deliver)
            if self.stdin_once:
                self.close_stdin()

    def deliver(self, channel: int | None, data: bytes) -> None:
        """Output for the client; None: the container ended, so the stream does."""
        if channel is None:
            self.finish()
            return
        self.send(wsproto.events.BytesMessage(data=bytes([channel]) + data))
