"""The persistent Python interpreter of a session sandbox's `python` tool (the supervisor starts
it, see session_supervisor.py): cells run in one namespace, figures and tables become files.

Standard library only: see session_supervisor.py for how the parts become one program."""

import ast
import base64
import json
import os
import resource
import sys
import threading
import traceback

if __name__ != "__main__":  # imported by agentmesh (type checks, tests); in the sandbox the parts are one program
    from agentmesh.tools.sandbox.session_common import Capped


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
