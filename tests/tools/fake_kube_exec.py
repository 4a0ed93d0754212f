"""pods/exec for the tests' Kubernetes API server (fake_kube.py), over a real websocket.

The channel protocol of the API server and kubelet — `v5.channel.k8s.io`, or `v4` for a client
(or a FakeKube whose `attach_protocols` says so) without v5: binary frames prefixed by their
channel, 0 stdin, 1 stdout, 2 stderr, 3 the Status when the process ends (`Success`, or
`Failure` with reason `NonZeroExitCode` and the exit code as its `ExitCode` cause); v5 adds 255
to close a channel. The process is the kubelet's to start (`FakeKube.exec_process`: a local
process in the pod's working directory; the image tests' PodmanKube: `podman exec -i`). When
the stream ends the process's stdin is closed, as the kubelet does. When the pod goes away
under the exec the stream closes with no Status, as the API server's does when its stream to
the kubelet breaks.
"""

from __future__ import annotations

import json
import threading
from urllib.parse import parse_qs, urlparse

import wsproto.events

from tests.tools.fake_kube import FakeKube, status_body
from tests.tools.fake_kube_ws import ChannelSession, channel_protocol, switch_protocols


def exit_status(code: int) -> dict:
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    return {"metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
            "message": f"command terminated with non-zero exit code: error executing command, exit code {code}",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}


def serve_exec(fake: FakeKube, handler, parts) -> None:
    key = (parts[3], parts[5])
    query = parse_qs(urlparse(handler.path).query)
    command = query.get("command", [])
    protocol = channel_protocol(fake, handler)
    if protocol is None:
        return
    with fake.cond:
        pod = fake.pods.get(key)
        running = key in fake.procs and fake.procs[key].poll() is None
    if pod is None:
        fake.answer(handler, 404, status_body(404, "NotFound", f'pods "{parts[5]}" not found'))
        return
    container = pod["spec"]["containers"][0]
    if query.get("container", [container["name"]])[-1] != container["name"]:
        fake.answer(handler, 400, status_body(400, "BadRequest", f"container {query['container'][-1]} is not valid for pod {parts[5]}"))
        return
    if not command:
        fake.answer(handler, 400, status_body(400, "BadRequest", "you must specify at least 1 command"))
        return
    if not running:
        fake.answer(handler, 400, status_body(400, "BadRequest", f'container {container["name"]} is not valid for pod {parts[5]}: not running'))
        return
    switch_protocols(handler, protocol)
    fake.execs_served.append((parts[5], protocol, command))
    ExecSession(fake, key, command, protocol, handler).run()


class ExecSession(ChannelSession):
    def __init__(self, fake: FakeKube, key: tuple[str, str], command: list[str], protocol: str, handler):
        super().__init__(fake, key, protocol, handler)
        self.command = command

    def run(self) -> None:
        try:
            self.proc = self.fake.exec_process(self.key, self.command)
        except OSError as exc:
            # What the runtime says for a command it cannot start (the Status, then the end).
            self.send(wsproto.events.BytesMessage(data=bytes([3]) + json.dumps({"metadata": {}, "status": "Failure", "reason": "InternalError", "message": f"failed to exec in container: {exc}"}).encode()))
            self.finish()
            return
        with self.fake.cond:
            self.fake.exec_procs.setdefault(self.key, []).append(self.proc)
        pumps = [threading.Thread(target=self.pump, args=(stream, channel), daemon=True)
                 for stream, channel in ((self.proc.stdout, 1), (self.proc.stderr, 2))]
        for pump in pumps:
            pump.start()
        threading.Thread(target=self.wait, args=(pumps,), daemon=True).start()
        try:
            self.receive()
        finally:
            self.close_stdin()  # the client went away: the kubelet closes the process's stdin

    def pump(self, stream, channel: int) -> None:
        for chunk in iter(lambda: stream.read1(65536), b""):
            self.send(wsproto.events.BytesMessage(data=bytes([channel]) + chunk))

    def wait(self, pumps: list[threading.Thread]) -> None:
        code = self.proc.wait()
        for pump in pumps:
            pump.join(timeout=5)
        with self.fake.cond:
            procs = self.fake.exec_procs.get(self.key, [])
            if self.proc in procs:
                procs.remove(self.proc)
            alive = self.key in self.fake.pods and self.key in self.fake.procs
        if alive:
            status = exit_status(code if code >= 0 else 128 - code)
            self.send(wsproto.events.BytesMessage(data=bytes([3]) + json.dumps(status).encode()))
        self.finish()
