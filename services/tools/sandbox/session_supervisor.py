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

Each reply is {"id": N, "exit_code": ..., "stdout": ..., "stderr": ..., "truncated": ..., "output_limit": ...};
a call this program could not run is answered with "failed": true and the reason in "stderr" (failed).
Every call is a thread here, so calls of one session run side by side (a background server while
the model keeps working); the replies share the stdout pipe under a lock. A call's process is
started by the spawner (see Spawner) when its limits allow, else forked from here.

The program is four files sent as one text (supervisor_link.SUPERVISOR_SOURCE: the sandbox has
a python3 and nothing of agentmesh): session_common.py, session_kernel.py (the interpreter),
session_spawner.py (how a call's process starts) and this one, in that order. Each imports what
it uses of the others only when imported as part of agentmesh; in the sandbox the names are
simply defined earlier in the same text.
"""

import json
import os
import queue
import resource
import signal
import subprocess
import sys
import threading

if __name__ != "__main__":  # imported by agentmesh (type checks, tests); in the sandbox the parts are one program
    from agentmesh.tools.sandbox.session_common import BOOT, Capped, call_env, kill_group, reply, set_limits
    from agentmesh.tools.sandbox.session_kernel import Kernel, on_cpu_limit
    from agentmesh.tools.sandbox.session_spawner import (
        SPAWNER_GONE,
        Spawner,
        SpawnerGone,
        TooLarge,
        drain,
        pipe_holders,
        spawner_main,
    )

__all__ = ["BOOT", "Supervisor"]


class Supervisor:
    def __init__(self):
        self.calls = {}  # id -> (pid, its Capped stdout, its Capped stderr) of a running exec call
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
        try:
            err_read, err_write = os.pipe()
        except OSError:  # out of descriptors: `failed` answers the call, nothing of it kept
            os.close(out_read)
            os.close(out_write)
            raise
        try:
            spawner = self.spawner_for(request)
            if spawner is not None:
                try:
                    pid, wait = spawner.spawn(call, request["argv"], call_env(request), out_write, err_write), spawner.wait
                    ended = spawner.ended_fd
                except TooLarge:
                    spawner = None  # forked from here instead
            if spawner is None:
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
        try:
            flood = drain(pid, {out_read: out, err_read: err}, request["drain"], ended)
            code = wait(call)
        finally:
            # A leftover process of the call's group may hold the pipes; or the call could not be
            # followed (drain raised: `failed` answers it): its group is killed either way.
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


def failed(request, exc):
    """Answer a call this program could not run or follow (no descriptor or thread to be had: a
    program of the session may exhaust or lower the limits it shares with this one). Unanswered,
    it would wait out its whole time limit and then end the sandbox."""
    reply({"id": request["id"], "exit_code": 126, "stdout": "", "truncated": False, "failed": True,
           "stderr": f"the session sandbox could not run this call: {type(exc).__name__}: {exc}\n"})


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
            try:
                threading.Thread(target=self._work, args=(inbox,), daemon=True).start()
            except RuntimeError as exc:  # no thread to be had: the session's processes at their limit
                failed(request, exc)
                return
        inbox.put((handler, request))

    def _work(self, inbox):
        while True:
            handler, request = inbox.get()
            try:
                handler(request)
            except Exception as exc:  # noqa: BLE001 — answered now, not left to the call's timeout
                failed(request, exc)
            with self.lock:
                if len(self.idle) >= self.keep:
                    return
                self.idle.append(inbox)


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
