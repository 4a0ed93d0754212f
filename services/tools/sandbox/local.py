"""The local executor: each call in a fresh bubblewrap jail on this machine.

Namespaces: user (the program runs as uid/gid 65534 inside), pid, net (unless the call may use
the network), ipc, uts, cgroup, mount. The root file system is built from read-only binds of the
system directories and a handful of /etc files; the session workspace is the only writable bind
(at /workspace); /tmp is a private size-limited tmpfs. Resource limits are applied inside the
jail by util-linux `prlimit` right before the program starts, so they count the jail's own
processes. A root service starts bwrap as an unprivileged host user (`setpriv`), see
`jail_host_identity`. Stopping a call (timeout, output flood, cancelled RPC) kills the jail's
init process — the kernel then kills everything in its PID namespace — and bwrap's process
group; `--die-with-parent` covers the service itself dying.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import shutil
import signal
import stat
import time
from pathlib import Path
from typing import Mapping

from opentelemetry import trace

from agentmesh.logs import get_logger
from agentmesh.telemetry.genai import GEN_AI_TOOL_CALL_ID
from agentmesh.telemetry.propagation import traceparent_env
from agentmesh.tools.sandbox.base import CommandResult, CommandSpec, NoMetrics, SandboxMetrics, SandboxUnavailable
from agentmesh.tools.sandbox.process import ProcessRun, kill_group, run_process
from agentmesh.tools.sandbox.seccomp import compile_filter, filter_fd
from agentmesh.tools.settings import SandboxLimits, ToolsSettings
from agentmesh.tools.workspace import Workspaces

log = get_logger("agentmesh.tools.sandbox")

SANDBOX_UID = 65534
SANDBOX_GID = 65534
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
JAIL_WORKSPACE = "/workspace"

# /etc entries programs need to run (dynamic linker cache, TLS roots, name service config,
# time zone). Never the whole of /etc: it holds host secrets (shadow, ssh keys, service config).
ETC_ALLOWLIST = (
    "alternatives",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "localtime",
    "nsswitch.conf",
    "host.conf",
    "hosts",
    "gai.conf",
    "mime.types",
    "protocols",
    "services",
)
NETWORK_ETC = ("resolv.conf",)
MERGED_USR_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")

INSTALL_HINT = (
    "command tools need bubblewrap to run isolated, and {path} was not found. Install it "
    "(Debian/Ubuntu: `apt-get install bubblewrap`; Fedora: `dnf install bubblewrap`) or set "
    "AGENTMESH_SANDBOX_BWRAP to its path. Running unisolated is possible only with "
    "AGENTMESH_SANDBOX_UNSAFE_NO_ISOLATION=true, which gives model-written programs this machine."
)

# Signals a program dies of when it hits an rlimit, and how we say so.
LIMIT_SIGNALS = {24: ("cpu_limit", "CPU time limit"), 25: ("file_size_limit", "file size limit")}


def clean_environment(extra: Mapping[str, str]) -> dict[str, str]:
    """The whole environment a sandboxed program gets: nothing of the service's own."""
    env = {"PATH": SANDBOX_PATH, "HOME": JAIL_WORKSPACE, "LANG": "C.UTF-8", "TMPDIR": "/tmp"}
    if extra.get("TRACEPARENT"):
        env["TRACEPARENT"] = extra["TRACEPARENT"]
    return env


def rlimit_prefix(limits: SandboxLimits, prlimit: str) -> list[str]:
    return [
        prlimit,
        # Soft below hard: the program gets SIGXCPU (reported as the CPU limit), SIGKILL a second later.
        f"--cpu={limits.cpu_s}:{limits.cpu_s + 1}",
        f"--as={limits.memory_bytes}",
        f"--nproc={limits.processes}",
        f"--fsize={limits.file_size_bytes}",
        "--core=0",
        "--",
    ]


def _system_tool(name: str) -> str:
    return shutil.which(name, path="/usr/bin:/bin:/usr/local/bin") or ""


def jail_host_identity(settings: ToolsSettings) -> tuple[int, int] | None:
    """The host (uid, gid) jailed programs run as, or None to run them as the service's own user.

    A root service must not hand its uid to the jail: the kernel exempts uid 0 from the process
    limit (a fork bomb would be unbounded) and root owns files a jail might see. bwrap then runs
    as `settings.host_uid`, which needs to traverse the path to the workspaces; when it cannot,
    the jail falls back to root's uid with a loud warning.
    """
    if os.geteuid() != 0:
        return None
    if not _system_tool("setpriv"):
        log.warning("setpriv (util-linux) not found: jailed programs keep root's uid; the process limit is not enforced")
        return None
    root = settings.workspace_root
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o711)
    for directory in [root, *root.parents]:
        if not os.stat(directory).st_mode & stat.S_IXOTH:
            log.warning(
                "the service runs as root and jailed programs cannot be given an unprivileged uid, "
                "because other users cannot traverse this directory; the kernel will not enforce the "
                "process limit (only the jail's watch will, late). Fix: chmod o+x the directory, or "
                "run the service as a non-root user",
                directory=str(directory),
            )
            return None
    return settings.host_uid, settings.host_gid


class LocalJail:
    """Executor for AGENTMESH_SANDBOX=local."""

    name = "local"

    def __init__(self, settings: ToolsSettings, workspaces: Workspaces, tracer: trace.Tracer, metrics: SandboxMetrics | None = None):
        self._settings = settings
        self._metrics = metrics or NoMetrics()
        # Set when the service is root: bwrap (and so the jail) runs as this host user.
        self._host_identity = workspaces.owner
        self._limits = settings.limits
        self._workspaces = workspaces
        self._tracer = tracer
        self._bwrap = shutil.which(settings.bwrap_path) or ""
        self._prlimit = _system_tool("prlimit")
        self._setpriv = _system_tool("setpriv")
        self._etc_dir = workspaces.root.parent / "sandbox-etc"
        self._seccomp: bytes | None = None
        if self._bwrap:
            self._write_identity_files()
            if settings.seccomp:
                self._seccomp = compile_filter()
            else:
                log.warning("AGENTMESH_SANDBOX_SECCOMP=false: jailed programs run without a seccomp filter")

    @property
    def available(self) -> bool:
        return bool(self._bwrap)

    def _write_identity_files(self) -> None:
        # A passwd/group naming the jail's user, so `whoami`, `ls -l` and Python's getpass work
        # without exposing the host's account list.
        self._etc_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self._etc_dir, 0o755)
        (self._etc_dir / "passwd").write_text(
            f"root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:{SANDBOX_UID}:{SANDBOX_GID}:sandbox:{JAIL_WORKSPACE}:/bin/sh\n"
        )
        (self._etc_dir / "group").write_text(f"root:x:0:\nsandbox:x:{SANDBOX_GID}:\n")

    def jail_argv(
        self, workspace: Path, spec: CommandSpec, info_fd: int | None = None, seccomp_fd: int | None = None
    ) -> list[str]:
        limits = self._limits
        argv = []
        if self._host_identity:
            # setpriv, not subprocess's user=: that makes Python fork() instead of vfork(), and
            # fork handlers of libraries in this process (gRPC's) then run in the child.
            uid, gid = self._host_identity
            argv += [self._setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]
        argv += [
            self._bwrap,
            "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID),
            "--disable-userns",
            "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--hostname", "sandbox",
            "--die-with-parent", "--new-session",
            "--ro-bind", "/usr", "/usr",
        ]  # fmt: skip
        if info_fd is not None:
            argv += ["--info-fd", str(info_fd)]
        if seccomp_fd is not None:
            argv += ["--seccomp", str(seccomp_fd)]
        if not spec.network:
            argv.append("--unshare-net")
        for path in MERGED_USR_DIRS:
            if os.path.islink(path):
                argv += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                argv += ["--ro-bind", path, path]
        etc = ETC_ALLOWLIST + (NETWORK_ETC if spec.network else ())
        for name in etc:
            source = Path("/etc") / name
            if source.exists():
                argv += ["--ro-bind", str(source), str(source)]
        argv += [
            "--ro-bind", str(self._etc_dir / "passwd"), "/etc/passwd",
            "--ro-bind", str(self._etc_dir / "group"), "/etc/group",
            "--proc", "/proc",
            "--dev", "/dev",
            "--size", str(limits.file_size_bytes), "--tmpfs", "/tmp",
            "--bind", str(workspace), JAIL_WORKSPACE,
            # The root itself is bwrap's scratch tmpfs; freeze it so only /workspace and /tmp take writes.
            "--remount-ro", "/",
            "--chdir", JAIL_WORKSPACE,
            "--clearenv",
        ]  # fmt: skip
        for key, value in clean_environment(spec.env).items():
            argv += ["--setenv", key, value]
        argv.append("--")
        if self._prlimit:
            argv += rlimit_prefix(limits, self._prlimit)
        argv += list(spec.argv)
        return argv

    async def run(self, spec: CommandSpec) -> CommandResult:
        if not self._bwrap:
            raise SandboxUnavailable(INSTALL_HINT.format(path=self._settings.bwrap_path))
        workspace = self._workspaces.ensure(spec.session_id)
        with self._tracer.start_as_current_span(
            "sandbox.jail",
            attributes={
                "agentmesh.sandbox.executor": "local",
                "agentmesh.session_id": spec.session_id,
                GEN_AI_TOOL_CALL_ID: spec.call_id,
                "agentmesh.sandbox.network": spec.network,
                "agentmesh.sandbox.timeout_s": spec.timeout_s,
                "agentmesh.sandbox.host_uid": self._host_identity[0] if self._host_identity else os.geteuid(),
            },
        ) as span:
            jailed = dataclasses.replace(spec, env={**spec.env, **traceparent_env()})
            info = JailInfo()
            asked = time.monotonic()
            loop = asyncio.get_running_loop()
            loop.add_reader(info.read_fd, info.on_readable)
            guard = JailWatch(info, self._limits.memory_bytes, self._limits.processes)
            watch = asyncio.create_task(guard.run())
            seccomp_fd = filter_fd(self._seccomp) if self._seccomp else None
            span.set_attribute("agentmesh.sandbox.seccomp", seccomp_fd is not None)
            try:
                run = await run_process(
                    self.jail_argv(workspace, jailed, info.write_fd, seccomp_fd),
                    env={"PATH": SANDBOX_PATH, "LANG": "C.UTF-8"},
                    cwd=str(workspace),
                    timeout_s=spec.timeout_s,
                    output_cap=self._limits.output_cap_bytes,
                    drain_limit=self._limits.output_drain_bytes,
                    pass_fds=(info.write_fd,) if seccomp_fd is None else (info.write_fd, seccomp_fd),
                    killer=info.kill,
                )
            finally:
                if seccomp_fd is not None:
                    os.close(seccomp_fd)
                watch.cancel()
                loop.remove_reader(info.read_fd)
                info.close()
            if info.reported_at is not None:
                # bwrap reports the jail's init right after cloning it: the jail exists.
                self._metrics.record_sandbox_wait(info.reported_at - asked, "local")
            result = interpret(run, spec, self._limits)
            if guard.exceeded == "memory":
                result.error_kind = "oom"
                result.detail = (
                    f"the sandbox's processes together used more than {self._limits.memory_bytes // 2**20} MiB "
                    "of memory and were stopped"
                )
            elif guard.exceeded == "processes":
                result.error_kind = "process_limit"
                result.detail = f"the sandbox ran more than {self._limits.processes} processes at once and was stopped"
            span.set_attribute("agentmesh.sandbox.exit_code", result.exit_code)
            if result.error_kind:
                span.set_attribute("agentmesh.sandbox.error_kind", result.error_kind)
            return result

    async def close(self) -> None:
        return None


class JailInfo:
    """bwrap's `--info-fd` report, for killing a jail from the inside out.

    Killing bwrap's own process first would rely on the jail's `--die-with-parent`, which bwrap
    arms only some way into setting the jail up; a jail cancelled in that window would run on.
    The PID of the jail's init (from the report, written right after bwrap clones it) is killed
    first instead — the kernel then ends everything in its PID namespace — and bwrap after it.
    """

    CHILD_PID = re.compile(rb'"child-pid"\s*:\s*(\d+)')

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        self._report = b""
        self.child_pid: int | None = None
        self.reported_at: float | None = None

    def on_readable(self) -> None:
        self._poll()
        if self.child_pid is not None and self.reported_at is None:
            self.reported_at = time.monotonic()

    def _poll(self) -> None:
        try:
            while chunk := os.read(self.read_fd, 4096):
                self._report += chunk
        except (BlockingIOError, OSError):
            pass
        match = self.CHILD_PID.search(self._report)
        if match:
            self.child_pid = int(match.group(1))

    async def kill(self, pid: int) -> None:
        self._poll()
        if self.child_pid is None and _alive(pid):
            # bwrap has not cloned the jail yet or not reported it; it does so within moments.
            for _ in range(100):
                await asyncio.sleep(0.01)
                self._poll()
                if self.child_pid is not None or not _alive(pid):
                    break
        if self.child_pid is not None:
            try:
                os.kill(self.child_pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        kill_group(pid)

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            try:
                os.close(fd)
            except OSError:
                pass


class JailWatch:
    """Bounds the jail's processes together: their resident memory, and their number.

    RLIMIT_AS bounds each process alone, so 128 processes could each take the limit; and when the
    jail has to run as root's uid (see `jail_host_identity`) the kernel does not enforce
    RLIMIT_NPROC at all. Without a cgroup of our own (not available to an unprivileged service
    everywhere) the jail's process tree is read from /proc ten times a second, and the jail is
    killed when it passes either limit.
    """

    INTERVAL_S = 0.1
    PAGE = os.sysconf("SC_PAGE_SIZE")

    def __init__(self, info: JailInfo, memory_bytes: int, processes: int):
        self._info = info
        self._memory = memory_bytes
        self._processes = processes
        self.exceeded = ""  # "memory" | "processes"

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.INTERVAL_S)
            init = self._info.child_pid
            if init is None:
                continue
            count, used = process_tree(init, self.PAGE, self._processes + 2)
            # The jail's init (bwrap) is not the program's; allow for it.
            if count > self._processes + 1:
                self.exceeded = "processes"
            elif used > self._memory:
                self.exceeded = "memory"
            else:
                continue
            try:
                os.kill(init, signal.SIGKILL)  # the jail's init: its whole PID namespace goes
            except (ProcessLookupError, PermissionError):
                pass
            return


def process_tree(root: int, page: int, max_count: int) -> tuple[int, int]:
    """(processes, resident bytes) of `root` and its descendants; counting stops past `max_count`."""
    total, pending, seen = 0, [root], set[int]()
    while pending and len(seen) <= max_count:
        pid = pending.pop()
        if pid in seen:
            continue
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
            seen.add(pid)
            for task in os.listdir(f"/proc/{pid}/task"):
                pending.extend(int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split())
        except (OSError, ValueError, IndexError):
            continue
    return len(seen), total


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def interpret(run: ProcessRun, spec: CommandSpec, limits: SandboxLimits) -> CommandResult:
    """Turn a finished process into a result that says plainly what happened."""
    stdout, stderr = run.stdout.text(), run.stderr.text()
    code = run.returncode
    result = CommandResult(
        exit_code=code, stdout=stdout, stderr=stderr, truncated=run.truncated, duration_ms=run.duration_ms
    )
    if run.timed_out:
        result.exit_code = -9
        result.error_kind = "timeout"
        result.detail = f"the command ran past its {spec.timeout_s:g} s time limit and was stopped (its whole process tree was killed)"
    elif run.output_limit:
        result.exit_code = -9
        result.error_kind = "output_limit"
        result.detail = (
            f"the command wrote more than {limits.output_drain_bytes} bytes of output and was stopped; "
            "redirect large output to a file in the workspace and read parts of it"
        )
    else:
        # bwrap reports a child killed by signal N as exit status 128+N.
        signal_no = code - 128 if code > 128 else (-code if code < 0 else 0)
        if signal_no in LIMIT_SIGNALS:
            kind, what = LIMIT_SIGNALS[signal_no]
            result.error_kind = kind
            result.detail = f"the command was stopped by the sandbox's {what}"
        elif code == 1 and stderr.startswith("bwrap:"):
            result.error_kind = "sandbox_error"
            result.detail = f"the sandbox could not start: {stderr.strip()}"
    return result
