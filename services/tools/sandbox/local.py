"""The local executor: each call in a fresh bubblewrap jail on this machine.

Namespaces: user (the program runs as uid/gid 65534 inside), pid, net (unless the call may use
the network), ipc, uts, cgroup, mount. The root file system is built from read-only binds of the
system directories and a handful of /etc files; the session workspace is the only writable bind
(at /workspace); /tmp and /dev/shm are private size-limited tmpfs (counted against the memory
limit) and /dev is otherwise read-only. bwrap reads its options from a memfd (`--args`), so no
environment value or host path is on any command line. Resource limits are applied inside the
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
import shutil
import stat
import time
from pathlib import Path
from typing import Mapping

from opentelemetry import trace

from agentmesh.logs import get_logger
from agentmesh.telemetry.genai import GEN_AI_TOOL_CALL_ID
from agentmesh.telemetry.propagation import traceparent_env
from agentmesh.tools.quota import UsageMeter, WorkspaceQuota
from agentmesh.tools.sandbox.base import CommandResult, CommandSpec, NoMetrics, SandboxMetrics, SandboxUnavailable
from agentmesh.tools.sandbox.egress import (
    EGRESS_RESOLV_CONF,
    EgressUnavailable,
    UserNetwork,
    attach_network,
    finish_network,
)
from agentmesh.tools.sandbox.jail_watch import JailInfo, JailWatch
from agentmesh.tools.sandbox.process import ProcessRun, run_process
from agentmesh.tools.sandbox.quota_results import apply_file_quota, apply_quota
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
    "matplotlibrc",  # Debian's matplotlib reads its defaults here: without it, it refuses to import
    "fonts",  # fontconfig's configuration, for programs that draw text
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


def rlimit_prefix(limits: SandboxLimits, prlimit: str, file_size_bytes: int | None = None) -> list[str]:
    """`file_size_bytes`: the per-file limit for this call when the workspace quota leaves less than
    the usual one (`limits.file_size_bytes`)."""
    fsize = limits.file_size_bytes if file_size_bytes is None else file_size_bytes
    return [
        prlimit,
        # Soft below hard: the program gets SIGXCPU (reported as the CPU limit), SIGKILL a second later.
        f"--cpu={limits.cpu_s}:{limits.cpu_s + 1}",
        f"--as={limits.memory_bytes}",
        f"--nproc={limits.processes}",
        f"--fsize={fsize}",
        "--core=0",
        "--",
    ]


# The jail's writable in-memory file systems. Each is a tmpfs bounded by its size, and what
# they hold counts against the jail's memory limit (the watch adds it to the processes' memory):
# tmpfs pages are host memory that no process's resident size shows.
def jail_tmpfs(limits: SandboxLimits) -> dict[str, int]:
    return {"/tmp": limits.tmp_bytes, "/dev/shm": limits.shm_bytes}


def bounded_tmpfs_options(limits: SandboxLimits) -> list[str]:
    """bwrap options for /dev and /tmp. `--dev` makes /dev a tmpfs without a size: anything
    written there (a file of /dev, POSIX shared memory in /dev/shm) took host memory without
    bound. So /dev is made read-only once built, with a bounded tmpfs for /dev/shm inside it."""
    return [
        "--dev", "/dev",
        "--size", str(limits.shm_bytes), "--tmpfs", "/dev/shm",
        "--remount-ro", "/dev",
        "--size", str(limits.tmp_bytes), "--tmpfs", "/tmp",
    ]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class JailCommand:
    """A jail's command line, and the bwrap options it reads from its `--args` descriptor."""

    argv: list[str]
    options: bytes

    def write_options(self, fd: int) -> None:
        """Fill `fd` (a memfd) with the options and rewind it for bwrap to read."""
        view = memoryview(self.options)
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)


def _system_binds(*, network: bool) -> list[str]:
    """bwrap arguments for the system's part of a jail's root: the merged-/usr links or
    directories (the layout, looked up once: it does not change while the service runs), and
    the /etc entries programs need — bwrap skips one that does not exist when the jail starts
    (`--ro-bind-try`), so each jail still gets those there are at that moment."""
    argv: list[str] = []
    for path in MERGED_USR_DIRS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    for name in ETC_ALLOWLIST + (NETWORK_ETC if network else ()):
        source = f"/etc/{name}"
        argv += ["--ro-bind-try", source, source]
    return argv


def system_tool(name: str) -> str:
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
    if not system_tool("setpriv"):
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
        self._quota = settings.workspace_quota
        self._meter = UsageMeter()
        self._tracer = tracer
        self._bwrap = shutil.which(settings.bwrap_path) or ""
        self._prlimit = system_tool("prlimit")
        self._setpriv = system_tool("setpriv")
        self._etc_dir = workspaces.root.parent / "sandbox-etc"
        self._seccomp: bytes | None = None
        # The system's part of every jail's root, looked up once: (without, with) the network.
        self._system_binds = (_system_binds(network=False), _system_binds(network=True))
        if self._bwrap:
            self._write_identity_files()
            if settings.seccomp:
                self._seccomp = compile_filter()
            else:
                log.warning("AGENTMESH_SANDBOX_SECCOMP=false: jailed programs run without a seccomp filter")

    @property
    def available(self) -> bool:
        return bool(self._bwrap)

    # What a session sandbox (session.py) builds its long-lived jail from: the same pieces.
    @property
    def limits(self) -> SandboxLimits:
        return self._limits

    @property
    def quota(self) -> WorkspaceQuota:
        return self._quota

    @property
    def workspaces(self) -> Workspaces:
        return self._workspaces

    @property
    def tracer(self) -> trace.Tracer:
        return self._tracer

    @property
    def seccomp(self) -> bytes | None:
        return self._seccomp

    @property
    def egress_allow(self) -> tuple[str, ...]:
        return self._settings.egress_allow

    @property
    def bwrap_path(self) -> str:
        return self._settings.bwrap_path

    @property
    def home(self) -> Path:
        """The service's home (its keys): nothing at or above it is ever bound into a jail."""
        return self._workspaces.root.parent

    def _write_identity_files(self) -> None:
        # A passwd/group naming the jail's user, so `whoami`, `ls -l` and Python's getpass work
        # without exposing the host's account list.
        self._etc_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self._etc_dir, 0o755)
        (self._etc_dir / "passwd").write_text(
            f"root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:{SANDBOX_UID}:{SANDBOX_GID}:sandbox:{JAIL_WORKSPACE}:/bin/sh\n"
        )
        (self._etc_dir / "group").write_text(f"root:x:0:\nsandbox:x:{SANDBOX_GID}:\n")
        # An egress jail's name server: slirp4netns's forwarder (egress.py), not the host's.
        (self._etc_dir / "resolv.conf").write_text(EGRESS_RESOLV_CONF)

    def jail_argv(
        self,
        workspace: Path,
        spec: CommandSpec,
        info_fd: int | None = None,
        seccomp_fd: int | None = None,
        file_size_bytes: int | None = None,
        extra_env: Mapping[str, str] | None = None,
        ro_binds: tuple[str, ...] = (),
        *,
        options_fd: int,
        rlimits: bool = True,
        block_fd: int | None = None,
    ) -> JailCommand:
        """The jail's command line, and bwrap's options for `--args options_fd` (what the caller
        must put on that descriptor). The options hold the environment (an MCP server's secrets)
        and host paths (the workspace's): on a command line they would show in every process
        listing of the host, and in the jail's own /proc/1/cmdline.

        `extra_env` and `ro_binds`: what a configured long-lived program (an MCP server) is
        given on top of the fixed set: its configured environment, and host directories (where it
        is installed) bound read-only at the same path.

        `rlimits=False`: the jail's program sets the limits on each process it starts instead (a
        session sandbox's supervisor, whose own CPU time must not run out with its calls').

        `block_fd`: bwrap waits for it before starting the program (an egress jail's network is
        set up meanwhile, egress.py)."""
        limits = self._limits
        argv = []
        if self._host_identity:
            # setpriv, not subprocess's user=: that makes Python fork() instead of vfork(), and
            # fork handlers of libraries in this process (gRPC's) then run in the child.
            uid, gid = self._host_identity
            argv += [self._setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]
        argv += [self._bwrap, "--args", str(options_fd), "--"]
        if self._prlimit and rlimits:
            argv += rlimit_prefix(limits, self._prlimit, file_size_bytes)
        argv += list(spec.argv)
        options = [
            "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID),
            "--disable-userns",
            "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--hostname", "sandbox",
            "--die-with-parent", "--new-session",
            "--ro-bind", "/usr", "/usr",
        ]  # fmt: skip
        if info_fd is not None:
            options += ["--info-fd", str(info_fd)]
        if seccomp_fd is not None:
            options += ["--seccomp", str(seccomp_fd)]
        # An egress jail has a network namespace of its own (a user-mode network, egress.py);
        # only AGENTMESH_SANDBOX_NETWORK shares the host's.
        host_network = spec.network and not spec.egress
        if not host_network:
            options.append("--unshare-net")
        if block_fd is not None:
            options += ["--block-fd", str(block_fd)]
        options += self._system_binds[host_network]
        if spec.egress:
            options += ["--ro-bind", str(self._etc_dir / "resolv.conf"), "/etc/resolv.conf"]
        options += [
            "--ro-bind", str(self._etc_dir / "passwd"), "/etc/passwd",
            "--ro-bind", str(self._etc_dir / "group"), "/etc/group",
        ]  # fmt: skip
        options += ["--proc", "/proc", *bounded_tmpfs_options(limits)]
        # After the tmpfs: a program installed under /tmp (a venv there) stays visible over the jail's own /tmp.
        for path in ro_binds:
            options += ["--ro-bind", path, path]
        options += [
            "--bind", str(workspace), JAIL_WORKSPACE,
            # The root itself is bwrap's scratch tmpfs; freeze it so only /workspace and the
            # bounded tmpfs take writes.
            "--remount-ro", "/",
            "--chdir", JAIL_WORKSPACE,
            "--clearenv",
        ]  # fmt: skip
        for key, value in {**(extra_env or {}), **clean_environment(spec.env)}.items():
            options += ["--setenv", key, value]
        return JailCommand(argv, b"".join(option.encode() + b"\0" for option in options))

    async def run(self, spec: CommandSpec) -> CommandResult:
        if not self._bwrap:
            raise SandboxUnavailable(INSTALL_HINT.format(path=self._settings.bwrap_path))
        workspace = self._workspaces.ensure(spec.session_id)
        # No file may outgrow what the quota leaves (one writer is stopped by the kernel at once);
        # many files together are the watch's to stop.
        before = await self._meter.measure(workspace)
        used_before = before.bytes
        file_size = min(self._limits.file_size_bytes, self._quota.remaining(used_before))
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
            guard = JailWatch(
                info,
                self._limits.memory_bytes,
                self._limits.processes,
                tmpfs=jail_tmpfs(self._limits),
                workspace=workspace,
                quota=self._quota,
                disk_baseline=used_before,
                files_baseline=before.files,
                meter=self._meter,
            )
            watch = asyncio.create_task(guard.run())
            seccomp_fd = filter_fd(self._seccomp) if self._seccomp else None
            span.set_attribute("agentmesh.sandbox.seccomp", seccomp_fd is not None)
            options_fd = -1
            network: UserNetwork | None = None
            attach: asyncio.Task[None] | None = None
            try:
                if spec.egress:
                    network = UserNetwork(allowed=self._settings.egress_allow)
                options_fd = os.memfd_create("bwrap-options", os.MFD_CLOEXEC)
                command = self.jail_argv(workspace, jailed, info.write_fd, seccomp_fd, file_size, options_fd=options_fd,
                                         block_fd=network.block_fd if network else None)
                command.write_options(options_fd)
                passed: tuple[int, ...] = (info.write_fd, options_fd) if seccomp_fd is None else (
                    info.write_fd, options_fd, seccomp_fd)
                if network is not None:
                    passed += (network.block_fd,)
                    attach = asyncio.create_task(attach_network(network, info))
                run = await run_process(
                    command.argv,
                    env={"PATH": SANDBOX_PATH, "LANG": "C.UTF-8"},
                    cwd=str(workspace),
                    timeout_s=spec.timeout_s,
                    output_cap=self._limits.output_cap_bytes,
                    drain_limit=self._limits.output_drain_bytes,
                    pass_fds=passed,
                    killer=info.kill,
                )
            except EgressUnavailable as exc:
                return CommandResult(exit_code=-1, stdout="", stderr="", error_kind="sandbox_error", detail=str(exc))
            finally:
                if options_fd >= 0:
                    os.close(options_fd)
                if seccomp_fd is not None:
                    os.close(seccomp_fd)
                network_failure = await finish_network(network, attach)
                watch.cancel()
                loop.remove_reader(info.read_fd)
                info.close()
            if info.reported_at is not None:
                # bwrap reports the jail's init right after cloning it: the jail exists.
                self._metrics.record_sandbox_wait(info.reported_at - asked, "local")
            result = interpret(run, spec, self._limits)
            if network_failure:
                result.exit_code, result.error_kind, result.detail = -1, "sandbox_error", network_failure
            elif guard.exceeded == "memory":
                result.error_kind = "oom"
                result.detail = (
                    f"the sandbox's processes together used more than {self._limits.memory_bytes // 2**20} MiB "
                    "of memory and were stopped"
                )
            elif guard.exceeded == "processes":
                result.error_kind = "process_limit"
                result.detail = f"the sandbox ran more than {self._limits.processes} processes at once and was stopped"
            else:
                after = await self._meter.measure(workspace)
                lowered = file_size < self._limits.file_size_bytes
                apply_quota(result, self._quota, used_before, after.bytes, lowered, stopped=guard.exceeded == "disk_quota")
                apply_file_quota(result, self._quota, before.files, after.files, stopped=guard.exceeded == "file_quota")
            span.set_attribute("agentmesh.sandbox.workspace_bytes", max(guard.disk_usage, used_before))
            span.set_attribute("agentmesh.sandbox.exit_code", result.exit_code)
            if result.error_kind:
                span.set_attribute("agentmesh.sandbox.error_kind", result.error_kind)
            return result

    async def close(self) -> None:
        self._meter.close()


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
