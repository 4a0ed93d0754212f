"""The program a session sandbox runs as its first process: a supervisor that starts each call's
command inside the long-lived jail, and the persistent Python interpreter (`kernel`) of the
`python` tool.

It runs under the jail's system Python, so it imports only the standard library and nothing of
agentmesh. Its text arrives as the first line of stdin (BOOT below: a short command line, and the
source shows in no process listing). The tools service then writes one JSON request per line to
its stdin and reads one JSON reply per line from its stdout:

  {"op": "exec", "id": N, "argv": [...], "env": {...}, "limits": {...}, "cap": B, "drain": B}
                                              (optional "inherit_env": true, see call_env; each of
                                              "limits"' entries is optional, see set_limits;
                                              optional "fsize_max", see Supervisor.spawner_for)
  {"op": "kill", "id": N}                     stop call N (its process group only)
  {"op": "peek", "id": N, "call": M}          the output of running call M so far
  {"op": "cell", "id": N, "code": "...", "cap": B, "env": {...}, "limits": {...}, "cpu_s": S}   run code in the kernel
  {"op": "interrupt", "id": N}                SIGINT to the kernel: the running cell raises KeyboardInterrupt
  {"op": "restart", "id": N}                  end the kernel; the next cell starts a fresh one

Each reply is {"id": N, "exit_code": ..., "stdout": ..., "stderr": ..., "truncated": ..., "output_limit": ...}.
Every call is a thread here, so calls of one session run side by side (a background server while
the model keeps working); the replies share the stdout pipe under a lock. A call's process is
started by the spawner (see Spawner) when its limits allow, else forked from here.

This file is one program: it is sent whole into the jail or pod (which has a python3 and nothing
of agentmesh), so the supervisor, its spawner and the kernel live in it together.
"""

import ast
import base64
import json
import os
import queue
import resource
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback

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


class Supervisor:
    def __init__(self):
        self.calls = {}  # id -> Popen of a running exec call
        self.kernel = None
        self.kernel_lock = threading.Lock()  # one cell at a time: the namespace is shared
        self.cell = None  # the id of the cell the kernel runs now
        self.dropped = set()  # ids of cells interrupted while they waited for the kernel
        self.cell_lock = threading.Lock()  # guards both: a cell starts or is dropped, not both
        self.spawner = None  # the Spawner calls start from while their limits are its own
        self.spawner_failed = None  # the limits a spawner could not start with: not tried again
        self.spawner_lock = threading.Lock()
        self.workers = Workers()

    # --- exec: a fresh process per call -------------------------------------------------------

    def run_exec(self, request):
        call = request["id"]
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        try:
            spawner = self.spawner_for(request)
            if spawner is not None:
                pid, wait = spawner.spawn(call, request["argv"], call_env(request), out_write, err_write), spawner.wait
                ended = spawner.ended_fd
            else:
                proc = subprocess.Popen(
                    request["argv"], stdin=subprocess.DEVNULL, stdout=out_write, stderr=err_write,
                    env=call_env(request), cwd=os.getcwd(), start_new_session=True,
                    preexec_fn=(lambda: set_limits(request["limits"])) if request["limits"] else None)  # noqa: PLW1509 — see set_limits
                pid, wait, ended = proc.pid, lambda _call: proc.wait(), None
        except OSError as exc:
            code, said = 127, str(exc)
            if isinstance(exc, SpawnerGone):
                # It may have started the process before it could say which: the processes that
                # hold the call's pipe are the call's.
                for holder in pipe_holders(out_read):
                    kill_group(holder)
                code, said = 128 + signal.SIGKILL, SPAWNER_GONE
            for fd in (out_read, err_read):
                os.close(fd)
            reply({"id": call, "exit_code": code, "stdout": "", "stderr": said, "truncated": False})
            return
        finally:
            os.close(out_write)
            os.close(err_write)
        out, err = Capped(request["cap"]), Capped(request["cap"])
        self.calls[call] = (pid, out, err)
        flood = drain(pid, {out_read: out, err_read: err}, request["drain"], ended)
        code = wait(call)
        # A leftover process of the call's group may hold the pipes: its group is killed with it.
        kill_group(pid)
        self.calls.pop(call, None)
        stderr = err.text() if code is not None else err.text() + SPAWNER_GONE
        reply({"id": call, "exit_code": 128 + signal.SIGKILL if code is None else code if code >= 0 else 128 - code,
               "stdout": out.text(), "stderr": stderr, "truncated": out.truncated or err.truncated or flood,
               "output_limit": flood})

    def spawner_for(self, request):
        """The spawner to start this call from, or None to fork it from here (see Spawner).

        A spawner holds the limits of the calls it starts as its own, so it serves the calls
        whose limits are exactly those: the usual ones. A call whose per-file limit is lowered
        (the workspace quota leaves less than "fsize_max") is forked from here instead, with its
        own; so is every call while no spawner can be had (it would not start: the address-space
        limit too small for a Python, say)."""
        limits = request["limits"]
        if not limits or limits.get("fsize") != request.get("fsize_max", limits.get("fsize")):
            return None  # no limits (a pod's calls): Popen starts it without a fork of this process
        with self.spawner_lock:
            current = self.spawner
            if current is not None and current.limits == limits and current.serving:
                return current
            if current is not None:
                current.retire()
            self.spawner = None
            if limits != self.spawner_failed:
                try:
                    self.spawner = Spawner(limits, call_env(request))
                except OSError:
                    self.spawner_failed = limits
            return self.spawner

    def kill(self, request):
        call = self.calls.get(request["id"])
        if call is not None:
            kill_group(call[0])

    def peek(self, request):
        call = self.calls.get(request["call"])
        if call is None:
            reply({"id": request["id"], "running": False, "stdout": "", "stderr": ""})
        else:
            reply({"id": request["id"], "running": True, "stdout": call[1].text(), "stderr": call[2].text()})

    # --- cell: the persistent interpreter -----------------------------------------------------

    def run_cell(self, request):
        with self.kernel_lock:
            with self.cell_lock:
                if request["id"] in self.dropped:
                    self.dropped.discard(request["id"])  # answered when it was dropped
                    return
                self.cell = request["id"]
            try:
                self._run_cell(request)
            finally:
                with self.cell_lock:
                    self.cell = None

    def _run_cell(self, request):
        source = None
        if self.kernel is None or self.kernel.poll() is not None:
            source = globals()["SOURCE"]  # set by BOOT, which runs this file
            # One malloc arena: the kernel's reader threads would each reserve one (64 MiB of
            # address space apiece), which the cell's address-space limit would pay for.
            env = dict(call_env(request), MPLBACKEND="Agg", PYTHONUNBUFFERED="1", MALLOC_ARENA_MAX="1")
            # The kernel lives across cells, so its CPU limit is per cell (Kernel.execute).
            self.kernel = subprocess.Popen(
                [sys.executable, "-I", "-c", BOOT, "kernel"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=os.getcwd(),
                start_new_session=True,
                preexec_fn=lambda: set_limits(request["limits"]))  # noqa: PLW1509 — see set_limits
        kernel = self.kernel
        requests, replies = kernel.stdin, kernel.stdout
        assert requests is not None and replies is not None  # both are pipes
        try:
            if source is not None:  # a fresh kernel reads its program first
                requests.write((json.dumps(source) + "\n").encode())
            requests.write((json.dumps({"code": request["code"], "cap": request["cap"], "cpu": request["cpu_s"],
                                        "fsize": request["fsize"]}) + "\n").encode())
            requests.flush()
            line = replies.readline()
        except OSError:
            line = b""
        if not line:
            # The kernel died in the cell (its CPU or memory limit, os._exit, a crash): its state is gone.
            kernel.wait()
            self.kernel = None
            reply({"id": request["id"], "exit_code": 128 + 9 if kernel.returncode < 0 else kernel.returncode,
                   "stdout": "", "stderr": "", "truncated": False, "kernel_lost": True})
            return
        result = json.loads(line)
        result["id"] = request["id"]
        reply(result)

    def interrupt(self, request):
        with self.cell_lock:
            if self.cell != request["id"]:
                # Its time ran out while another cell of the session ran (or it has ended, and
                # this answer is for nobody): it never starts, and is answered now.
                self.dropped.add(request["id"])
                reply({"id": request["id"], "exit_code": 1, "stdout": "", "truncated": False, "interrupted": True,
                       "stderr": "KeyboardInterrupt: the cell's time ran out while another cell ran; it did not start\n"})
                return
        if self.kernel is not None and self.kernel.poll() is None:
            try:
                os.kill(self.kernel.pid, signal.SIGINT)
            except ProcessLookupError:
                pass

    def restart(self, request):
        kernel, self.kernel = self.kernel, None
        if kernel is not None:
            kill_group(kernel.pid)
        with self.kernel_lock:  # a cell still running ends with its kernel
            pass
        reply({"id": request["id"], "exit_code": 0, "stdout": "", "stderr": "", "truncated": False})

    def serve(self):
        handlers = {"exec": self.run_exec, "cell": self.run_cell}
        instant = {"kill": self.kill, "peek": self.peek, "interrupt": self.interrupt, "restart": self.restart}
        for line in sys.stdin.buffer:
            request = json.loads(line)
            op = request["op"]
            if op in instant:
                instant[op](request)
            else:
                self.workers.run(handlers[op], request)
        # stdin closed: the service let go of this sandbox (or died); everything here ends with us.
        # In a jail its PID namespace ends anyway; in a pod (k8s_supervisor.py) the pod lives on,
        # so the calls' process groups and the kernel are killed here: the lifeline rule.
        for pid, _, _ in list(self.calls.values()):
            kill_group(pid)
        if self.kernel is not None:
            kill_group(self.kernel.pid)


class Workers:
    """The threads calls run on, kept a while when idle: handing a call to a waiting thread costs
    a wake-up, starting one several times that (tens of microseconds of a ~3 ms call)."""

    def __init__(self, keep=4):
        self.idle = []  # the inboxes of the threads waiting for a call
        self.lock = threading.Lock()
        self.keep = keep

    def run(self, handler, request):
        with self.lock:
            inbox = self.idle.pop() if self.idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(target=self._work, args=(inbox,), daemon=True).start()
        inbox.put((handler, request))

    def _work(self, inbox):
        while True:
            handler, request = inbox.get()
            handler(request)
            with self.lock:
                if len(self.idle) >= self.keep:
                    return
                self.idle.append(inbox)


class SpawnerGone(OSError):
    """The spawner ended (its CPU time, or a program of the session killed it)."""


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
        except OSError:
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
    total, flood = 0, False
    try:
        while streams:
            events = selector.select(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if not events and deadline is not None:
                break
            for key, _ in events:
                if key.data == "spawner":
                    selector.unregister(key.fd)
                    deadline = time.monotonic() + 0.5
                    kill_group(pid)
                    continue
                if key.fd == pidfd:
                    selector.unregister(pidfd)
                    os.close(pidfd)
                    pidfd, deadline = None, time.monotonic() + 0.5
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
        selector.close()
    return flood


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


# --- the kernel -------------------------------------------------------------------------------


class CpuLimit(BaseException):
    """The cell used its CPU time (SIGXCPU)."""


def on_cpu_limit(signum, frame):
    raise CpuLimit("the cell used up its CPU time")


class Kernel:
    """A persistent namespace: each cell is executed in it, the value of a last bare expression is
    shown as the interactive interpreter would, figures matplotlib still holds are saved as PNG
    files under /workspace/.outputs. Output goes through fd 1 and 2 (so a subprocess's does too)
    into pipes this process reads with a thread each."""

    def __init__(self):
        self.pid = os.getpid()
        os.environ.pop("MALLOC_ARENA_MAX", None)  # read by glibc at start; the cell's programs get the usual
        # matplotlib draws to files (no display here), its font cache in the jail's /tmp rather
        # than the session's workspace (HOME).
        os.environ.setdefault("MPLBACKEND", "Agg")
        os.environ.setdefault("MPLCONFIGDIR", "/tmp/.matplotlib")
        threading.stack_size(256 * 1024)  # the reader threads' stacks, also out of the address-space limit
        self.requests = sys.stdin.buffer
        self.replies = os.fdopen(os.dup(1), "wb", buffering=0)
        self.namespace = {"__name__": "__main__", "__builtins__": __builtins__}
        self.figures = 0
        self.tables = 0
        self.cell_tables = []  # the CSV files this cell's tables were saved as
        self.streams = []
        for fd in (1, 2):
            read_end, write_end = os.pipe()
            os.dup2(write_end, fd)
            os.close(write_end)
            self.streams.append(Stream(read_end))
        sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115 — for the kernel's life
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115 — for the kernel's life

    def serve(self):
        for line in self.requests:
            request = json.loads(line)
            for stream in self.streams:
                stream.begin(request["cap"])
            images_before = images()
            self.cell_tables = []
            error = self.execute(request["code"], request["cpu"], request["fsize"])
            if os.getpid() != self.pid:
                # A process the cell forked came back out of the cell (an exception in the
                # child): it must not go on as a second kernel on the same pipes.
                os._exit(1)
            figures = self.save_figures()
            # PNG files the cell wrote itself (savefig, PIL, ...) are named as figures too.
            figures += sorted(p for p, stamp in images().items() if images_before.get(p) != stamp and p not in figures)
            sys.stdout.flush()
            sys.stderr.flush()
            out, err = (stream.end(fd) for fd, stream in zip((1, 2), self.streams, strict=True))
            self.replies.write((json.dumps({
                "exit_code": 1 if error else 0, "stdout": out.text(), "stderr": err.text(),
                "truncated": out.truncated or err.truncated, "interrupted": error == "interrupted",
                "cpu_limit": error == "cpu_limit",
                "figures": figures, "tables": self.cell_tables}) + "\n").encode())

    def execute(self, code, cpu_s, fsize):
        # This cell's CPU time: the soft limit moves to what the interpreter has used plus the
        # call's allowance; SIGXCPU then ends the cell (CpuLimit), not the interpreter. The hard
        # limit stays open so the next cell can move it again, which a cell could do too: the
        # call's wall clock (an interrupt) is what bounds it for sure.
        used = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
        resource.setrlimit(resource.RLIMIT_CPU, (int(used) + cpu_s, resource.RLIM_INFINITY))
        # The per-file limit is lowered for this cell when the workspace quota leaves less (soft
        # only: the hard limit, set when the interpreter started, stays for the next cell).
        hard_fsize = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        resource.setrlimit(resource.RLIMIT_FSIZE, (min(fsize, hard_fsize), hard_fsize))
        try:
            return self._execute(code)
        finally:
            resource.setrlimit(resource.RLIMIT_CPU, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
            resource.setrlimit(resource.RLIMIT_FSIZE, (hard_fsize, hard_fsize))

    def _execute(self, code):
        try:
            tree = ast.parse(code, "<cell>", "exec")
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, "<cell>", "exec"), self.namespace)
            if last is not None:
                value = eval(compile(last, "<cell>", "eval"), self.namespace)
                if value is not None:
                    self.namespace["_"] = value
                    print(self.show(value))
        except KeyboardInterrupt as exc:
            print_cell_error(exc)
            return "interrupted"
        except CpuLimit as exc:
            print_cell_error(exc)
            return "cpu_limit"
        except BaseException as exc:  # noqa: BLE001 — SystemExit too: the kernel stays, the cell failed
            print_cell_error(exc)
            return "error"
        return ""

    def show(self, value):
        """A pandas DataFrame as a Markdown table, and saved whole as CSV under .outputs/ (named
        in the reply); anything else as `show` gives it."""
        if type(value).__name__ != "DataFrame" or not type(value).__module__.startswith("pandas"):
            return show(value)
        try:
            table = markdown_table(value)
        except Exception:  # noqa: BLE001 — an odd frame (a MultiIndex, ...) is still shown as pandas renders it
            return show(value)
        try:
            os.makedirs("/workspace/.outputs", exist_ok=True)
            self.tables += 1
            path = f".outputs/table-{self.tables}.csv"
            value.to_csv("/workspace/" + path)
            self.cell_tables.append(path)
        except Exception as exc:  # noqa: BLE001 — a full disk or a quota: the table is still shown
            table += f"\n[the table could not be saved as CSV: {exc}]"
        return table

    def save_figures(self):
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is None:
            return []
        saved = []
        try:
            for number in pyplot.get_fignums():
                self.figures += 1
                os.makedirs("/workspace/.outputs", exist_ok=True)
                path = f".outputs/figure-{self.figures}.png"
                pyplot.figure(number).savefig("/workspace/" + path, format="png")
                saved.append(path)
            pyplot.close("all")
        except Exception:  # noqa: BLE001 — a figure that cannot be saved is the cell's error, shown to it
            traceback.print_exc()
        return saved


def images():
    """The PNG files at the workspace's top and in .outputs/, with their change times: one
    directory listing each (not a walk of the workspace, which may be large)."""
    found = {}
    for directory, prefix in (("/workspace", ""), ("/workspace/.outputs", ".outputs/")):
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    if entry.name.lower().endswith(".png") and entry.is_file(follow_symlinks=False):
                        found[prefix + entry.name] = entry.stat(follow_symlinks=False).st_mtime_ns
        except OSError:
            continue
    return found


def print_cell_error(exc):
    """The traceback from the cell's own frames on (the kernel's `execute` frame is noise)."""
    tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
    traceback.print_exception(type(exc), exc, tb)


def show(value):
    """A table as text (pandas' whole-frame rendering, bounded), anything else as its repr."""
    to_string = getattr(value, "to_string", None)
    if callable(to_string) and type(value).__module__.startswith("pandas"):
        try:
            return to_string(max_rows=60, max_cols=20)
        except TypeError:
            return to_string()
    return repr(value)


TABLE_ROWS, TABLE_COLUMNS, TABLE_CELL_CHARS = 30, 20, 80


def markdown_table(frame):
    """A DataFrame's first rows and columns as a Markdown table (the model and the console read
    it as a table), with a line saying what was left out. Written here, not pandas' to_markdown,
    which needs the `tabulate` package the sandbox may not have."""

    def cell(value):
        text = " ".join(str(value).split()).replace("|", "\\|")
        return text if len(text) <= TABLE_CELL_CHARS else text[:TABLE_CELL_CHARS - 1] + "…"

    rows, columns = frame.shape
    shown = frame.iloc[:TABLE_ROWS, :TABLE_COLUMNS]
    lines = ["| " + " | ".join([cell(frame.index.name or "")] + [cell(c) for c in shown.columns]) + " |",
             "|" + "---|" * (len(shown.columns) + 1)]
    for index, values in zip(shown.index, shown.itertuples(index=False, name=None), strict=True):
        lines.append("| " + " | ".join([cell(index)] + [cell(v) for v in values]) + " |")
    if rows > TABLE_ROWS or columns > TABLE_COLUMNS:
        lines.append(f"[{rows} rows × {columns} columns; shown: the first {min(rows, TABLE_ROWS)} rows and "
                     f"{min(columns, TABLE_COLUMNS)} columns]")
    return "\n".join(lines)


class Stream:
    """One of the kernel's output pipes, drained all the time (a flood never blocks the cell),
    marked at each cell's end so the reply holds exactly what was written before it."""

    def __init__(self, fd):
        self.fd = fd
        self.lock = threading.Lock()
        self.capped = Capped(0)
        self.marker = b""
        self.marked = threading.Event()
        threading.Thread(target=self.pump, daemon=True).start()

    def begin(self, cap):
        with self.lock:
            self.capped = Capped(cap)

    def end(self, fd):
        self.marker = b"\0cell-end-" + base64.b16encode(os.urandom(8)) + b"\0"
        self.marked.clear()
        os.write(fd, self.marker)
        self.marked.wait(5)
        with self.lock:
            return self.capped

    def pump(self):
        pending = b""
        while chunk := os.read(self.fd, 65536):
            pending += chunk
            marker = self.marker
            with self.lock:
                if marker and marker in pending:
                    before, _, pending = pending.partition(marker)
                    self.capped.feed(before)
                    self.marker = b""
                    self.marked.set()
                    continue
                # Keep a marker's length back: it may arrive split across two reads.
                keep = len(marker) if marker else 0
                self.capped.feed(pending[: len(pending) - keep] if keep else pending)
                pending = pending[len(pending) - keep:] if keep else b""


# The whole command line of the supervisor and of the kernel: read this file's text (one JSON
# string) from stdin and run it as __main__, with SOURCE set to it.
BOOT = ("import json, sys; SOURCE = json.loads(sys.stdin.buffer.readline()); "
        "exec(compile(SOURCE, 'session_supervisor', 'exec'), {'__name__': '__main__', 'SOURCE': SOURCE})")

if __name__ == "__main__":
    if sys.argv[1:2] == ["spawner"]:
        spawner_main(int(sys.argv[2]))
    elif sys.argv[1:] == ["kernel"]:
        # SIGINT interrupts the cell (KeyboardInterrupt); Python's default handler does just that.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGXCPU, on_cpu_limit)
        Kernel().serve()
    else:
        # The calls' processes dump no core (set_limits): a call with no limits to set inherits it.
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        Supervisor().serve()
