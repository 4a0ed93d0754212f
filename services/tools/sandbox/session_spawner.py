"""How the session supervisor (session_supervisor.py) starts a call's process: from a spawner
that holds the call's rlimits as its own, and how it reads the process's output.

Standard library only: see session_supervisor.py for how the parts become one program."""

import errno
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time

if __name__ != "__main__":  # imported by agentmesh (type checks, tests); in the sandbox the parts are one program
    from agentmesh.tools.sandbox.session_common import BOOT, kill_group, set_limits


class SpawnerGone(OSError):
    """The spawner ended (its CPU time, or a program of the session killed it)."""


class TooLarge(Exception):
    """The call's request is larger than one message to the spawner may be (the socket's send
    buffer, ~208 KiB here: a command of 60,000 non-ASCII characters is 360 KB of JSON)."""


SPAWNER_GONE = ("\n[the session sandbox's process starter ended (a program of the session may have killed it); "
                "the call was stopped; the next call gets a new one]\n")


def pipe_holders(read_fd):
    """The processes that hold the write end of this pipe (found by its inode in /proc)."""
    name = f"pipe:[{os.fstat(read_fd).st_ino}]"
    holders = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if any(os.readlink(f"/proc/{entry}/fd/{fd}") == name for fd in os.listdir(f"/proc/{entry}/fd")):
                holders.append(int(entry))
        except OSError:
            continue  # it ended meanwhile
    return holders


class Spawner:
    """A process that starts calls' processes with the limits it holds as its own.

    A call's process must start with the per-call jail's rlimits. Setting them between fork and
    exec means forking this (Python) process, about 1.3 ms a call here (a fork of Python, its
    page tables, copies of the pages both sides then touch), most of a session call; exec'ing
    util-linux `prlimit` first costs about as much. The spawner is a Python of its own started
    once with those limits (set_limits), and starts each call with posix_spawn (vfork and exec):
    the call inherits the limits at the price of the exec alone.

    Protocol, over a SOCK_SEQPACKET pair (a message is one JSON object): the supervisor sends
    {"id", "argv", "env"} with the call's stdout and stderr pipe ends attached (SCM_RIGHTS); the
    spawner answers {"id", "pid"} or {"id", "error"}, and, when the process ends, {"id", "code"}
    (as Popen's returncode). Its own CPU time counts against the CPU limit it holds: when it
    reaches the soft limit (SIGXCPU) it says {"retire": true}, starts no more and ends when the
    supervisor lets go of it; a new one takes over.

    No thread reads the answers: a call waiting for one reads while no other call does, and
    files what it reads for whichever call it is (with one call in flight, no thread switch)."""

    def __init__(self, limits, env):
        self.limits = limits
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.cond = threading.Condition()
        self.started = {}  # call id -> the spawner's answer to its start
        self.codes = {}  # call id -> its process's returncode
        self.reading = False  # a call is in recv
        self.in_flight = 0
        self.retiring = False
        self.gone = False
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-c", BOOT, "spawner", str(theirs.fileno())], stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=os.getcwd(), pass_fds=[theirs.fileno()],
                start_new_session=True, preexec_fn=lambda: set_limits(limits))  # noqa: PLW1509 — see set_limits
        finally:
            theirs.close()
        source = self.proc.stdin
        assert source is not None  # a pipe
        try:
            source.write((json.dumps(globals()["SOURCE"]) + "\n").encode())
            source.close()
            ready = self.sock.recv(256)
        except OSError:
            ready = b""
        if not ready:
            self.close()
            self.proc.wait()
            self.sock.close()
            raise SpawnerGone("the spawner did not start")
        # Readable once the spawner has exited: a call's drain looks at it too (Supervisor.run_exec).
        self.ended_fd = os.pidfd_open(self.proc.pid)
        self.reaped = self.released = False

    @property
    def serving(self):
        return not (self.retiring or self.gone)

    def spawn(self, call, argv, env, stdout, stderr):
        with self.cond:
            self.in_flight += 1
        try:
            socket.send_fds(self.sock, [json.dumps({"id": call, "argv": argv, "env": env}).encode()], [stdout, stderr])
        except OSError as exc:
            if exc.errno == errno.EMSGSIZE:
                self._done()
                raise TooLarge() from None
            with self.cond:
                self._end()
        answer = self._await(self.started, call)
        if answer is None or "error" in answer:
            self._done()
            if answer is None:
                raise SpawnerGone("the session sandbox's process starter ended")
            raise OSError(answer["error"])
        return answer["pid"]

    def wait(self, call):
        """The call's returncode; None when the spawner ended before it could say."""
        code = self._await(self.codes, call)
        self._done()
        return code

    def _await(self, answers, call):
        with self.cond:
            while call not in answers and not self.gone:
                if self.reading:
                    self.cond.wait()
                    continue
                self.reading = True
                self.cond.release()
                try:
                    message = self.sock.recv(65536)
                except OSError:
                    message = b""
                finally:
                    self.cond.acquire()
                    self.reading = False
                self._file(message)
                self.cond.notify_all()
            return answers.pop(call, None)

    def _file(self, message):
        """Files one answer (under the condition's lock); an empty one is the spawner's end."""
        if not message:
            self._end()
            return
        answer = json.loads(message)
        if answer.get("retire"):
            self.retiring = True
        elif "code" in answer:
            self.codes[answer["id"]] = answer["code"]
        else:
            self.started[answer["id"]] = answer

    def _end(self):
        if not self.gone:
            self.gone = True
            self.close()
            threading.Thread(target=self._reap, daemon=True).start()

    def _reap(self):
        self.proc.wait()  # it exits once it reads the end
        with self.cond:
            self.reaped = True
            self._release()

    def _release(self):
        """Closes the socket and the pidfd once nothing uses them (under the condition's lock)."""
        if self.reaped and self.in_flight == 0 and not self.reading and not self.released:
            self.released = True
            self.sock.close()
            os.close(self.ended_fd)

    def retire(self):
        with self.cond:
            self.retiring = True
            if self.in_flight == 0:
                self._end()

    def _done(self):
        with self.cond:
            self.in_flight -= 1
            if self.in_flight == 0 and self.retiring:
                self._end()
            self._release()

    def close(self):
        # shutdown, not close: a call may be in recv on it; the spawner reads the end and exits.
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def spawner_main(fd):
    """The spawner process (see Spawner)."""
    sock = socket.socket(fileno=fd)
    sock.set_inheritable(False)
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    running: dict[int, tuple[int, int]] = {}  # pidfd -> (call id, pid)
    retire: list[bool] = []

    def on_cpu_limit(signum, frame):
        if not retire:
            retire.append(True)
            sock.send(b'{"retire": true}')

    signal.signal(signal.SIGXCPU, on_cpu_limit)  # a handler, not SIG_IGN: the calls' processes get the default
    sock.send(b'{"ready": true}')
    while True:
        for key, _ in selector.select():
            if key.fileobj is not sock:
                selector.unregister(key.fd)
                os.close(key.fd)
                call, pid = running.pop(key.fd)
                code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
                sock.send(json.dumps({"id": call, "code": code}).encode())
                continue
            try:
                message, fds, _, _ = socket.recv_fds(sock, 1 << 20, 2)
            except OSError:
                message, fds = b"", []
            if not message:
                return  # the supervisor let go: the calls' processes are its to end
            request = json.loads(message)
            try:
                pid = spawn(request["argv"], request["env"], fds[0], fds[1])
            except OSError as exc:
                sock.send(json.dumps({"id": request["id"], "error": str(exc)}).encode())
                continue
            finally:
                for received in fds:
                    os.close(received)
            pidfd = os.pidfd_open(pid)
            running[pidfd] = (request["id"], pid)
            selector.register(pidfd, selectors.EVENT_READ)
            sock.send(json.dumps({"id": request["id"], "pid": pid}).encode())


def spawn(argv, env, stdout, stderr):
    """posix_spawn (vfork and exec) of a call's program, as Popen(stdin=DEVNULL,
    start_new_session=True) would start it: found on the call's PATH, SIGPIPE and SIGXFSZ back
    to their defaults (Python ignores both), no fd but 0-2 passed on (the received ones are
    closed on exec)."""
    program = argv[0]
    if "/" not in program:
        for directory in env.get("PATH", os.defpath).split(os.pathsep):
            candidate = os.path.join(directory or ".", program)
            if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
                program = candidate
                break
        else:
            raise FileNotFoundError(2, "No such file or directory", program)
    for fd in (stdout, stderr):
        os.set_inheritable(fd, False)
    return os.posix_spawn(program, argv, env, setsid=True, setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
                          file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                                        (os.POSIX_SPAWN_DUP2, stdout, 1), (os.POSIX_SPAWN_DUP2, stderr, 2)])


def drain(pid, streams, limit, spawner_ended=None):
    """Reads a call's output pipes ({fd: Capped}) on this thread until both end, and returns
    whether the call wrote more than `limit` bytes (its group is killed then, the rest dropped).

    The process's end (its pidfd) kills its group, so that a leftover process holding the pipes
    ends too; what is still in them is read for half a second at most. So does the end of the
    spawner that started it (`spawner_ended`, its pidfd): nothing could tell the call's exit."""
    selector, pidfd = None, None
    total, flood = 0, False
    try:
        # Its own descriptor first: without one (the session used them up) the call is not
        # followed, and the caller stops it; the pipes are closed below either way.
        selector = selectors.DefaultSelector()
        for fd in streams:
            selector.register(fd, selectors.EVENT_READ)
        if spawner_ended is not None:
            selector.register(spawner_ended, selectors.EVENT_READ, "spawner")
        try:
            pidfd = os.pidfd_open(pid)
            selector.register(pidfd, selectors.EVENT_READ)
            deadline = None
        except OSError:  # it has ended (and been reaped) already
            pidfd, deadline = None, time.monotonic() + 0.5
            kill_group(pid)
        while streams:
            events = selector.select(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if not events and deadline is not None:
                break
            for key, _ in events:
                if key.data == "spawner" or key.fd == pidfd:  # the process, or its spawner, ended
                    selector.unregister(key.fd)
                    if key.fd == pidfd:
                        os.close(pidfd)
                        pidfd = None
                    deadline = time.monotonic() + 0.5
                    kill_group(pid)
                    continue
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fd)
                    os.close(key.fd)
                    del streams[key.fd]
                    continue
                total += len(chunk)
                if total > limit:
                    if not flood:
                        flood = True
                        kill_group(pid)
                    continue
                streams[key.fd].feed(chunk)
    finally:
        for fd in list(streams) + ([pidfd] if pidfd is not None else []):
            os.close(fd)
        if selector is not None:
            selector.close()
    return flood
