"""The program a session sandbox runs as its first process: a supervisor that starts each call's
command inside the long-lived jail, and the persistent Python interpreter (`kernel`) of the
`python` tool.

It runs under the jail's system Python, so it imports only the standard library and nothing of
agentmesh. Its text arrives as the first line of stdin (BOOT below: a short command line, and the
source shows in no process listing). The tools service then writes one JSON request per line to
its stdin and reads one JSON reply per line from its stdout:

  {"op": "exec", "id": N, "argv": [...], "env": {...}, "limits": {...}, "cap": B, "drain": B}
                                              (optional "inherit_env": true, see call_env; each of
                                              "limits"' entries is optional, see set_limits)
  {"op": "kill", "id": N}                     stop call N (its process group only)
  {"op": "peek", "id": N, "call": M}          the output of running call M so far
  {"op": "cell", "id": N, "code": "...", "cap": B, "env": {...}, "limits": {...}, "cpu_s": S}   run code in the kernel
  {"op": "interrupt", "id": N}                SIGINT to the kernel: the running cell raises KeyboardInterrupt
  {"op": "restart", "id": N}                  end the kernel; the next cell starts a fresh one

Each reply is {"id": N, "exit_code": ..., "stdout": ..., "stderr": ..., "truncated": ..., "output_limit": ...}.
Every call is a thread here, so calls of one session run side by side (a background server while
the model keeps working); the replies share the stdout pipe under a lock.
"""

import ast
import base64
import json
import os
import resource
import signal
import subprocess
import sys
import threading
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

    # --- exec: a fresh process per call -------------------------------------------------------

    def run_exec(self, request):
        try:
            proc = subprocess.Popen(
                request["argv"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=call_env(request), cwd=os.getcwd(), start_new_session=True,
                preexec_fn=lambda: set_limits(request["limits"]))  # noqa: PLW1509 — see set_limits
        except OSError as exc:
            reply({"id": request["id"], "exit_code": 127, "stdout": "", "stderr": str(exc), "truncated": False})
            return
        out, err = Capped(request["cap"]), Capped(request["cap"])
        self.calls[request["id"]] = (proc, out, err)
        state = {"flood": False, "total": 0}

        def pump(stream, capped):
            while chunk := os.read(stream.fileno(), 65536):
                state["total"] += len(chunk)
                if state["total"] > request["drain"]:
                    if not state["flood"]:
                        state["flood"] = True
                        kill_group(proc.pid)
                    continue
                capped.feed(chunk)

        pumps = [threading.Thread(target=pump, args=(proc.stdout, out), daemon=True),
                 threading.Thread(target=pump, args=(proc.stderr, err), daemon=True)]
        for thread in pumps:
            thread.start()
        code = proc.wait()
        # A leftover process of the call's group may hold the pipes: its group is killed with it.
        kill_group(proc.pid)
        for thread in pumps:
            thread.join(0.5)
        self.calls.pop(request["id"], None)
        reply({"id": request["id"], "exit_code": code if code >= 0 else 128 - code, "stdout": out.text(),
               "stderr": err.text(), "truncated": out.truncated or err.truncated or state["flood"],
               "output_limit": state["flood"]})

    def kill(self, request):
        call = self.calls.get(request["id"])
        if call is not None:
            kill_group(call[0].pid)

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
                threading.Thread(target=handlers[op], args=(request,), daemon=True).start()
        # stdin closed: the service let go of this sandbox (or died); everything here ends with us.
        # In a jail its PID namespace ends anyway; in a pod (k8s_supervisor.py) the pod lives on,
        # so the calls' process groups and the kernel are killed here: the lifeline rule.
        for proc, _, _ in list(self.calls.values()):
            kill_group(proc.pid)
        if self.kernel is not None:
            kill_group(self.kernel.pid)


def set_limits(limits):
    """In a child between fork and exec: the limits a per-call jail sets with prlimit
    (local.rlimit_prefix); CPU soft below hard: SIGXCPU first (the CPU limit), SIGKILL a second
    later. The kernel's request has no CPU entry: its CPU limit is per cell (Kernel.execute).

    Here and not by exec'ing prlimit, which costs some 6 ms a call (most of a session call). A
    preexec function is unsafe in a threaded program when the child needs a lock another thread
    held at the fork; this one only calls setrlimit, and the supervisor's other threads hold no
    lock but the GIL (which the forking thread has)."""
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
    if sys.argv[1:] == ["kernel"]:
        # SIGINT interrupts the cell (KeyboardInterrupt); Python's default handler does just that.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGXCPU, on_cpu_limit)
        Kernel().serve()
    else:
        Supervisor().serve()
