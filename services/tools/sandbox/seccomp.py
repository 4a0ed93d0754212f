"""A seccomp filter for the local jail: kernel interfaces a tool never needs answer EPERM.

Namespaces and rlimits decide what a jailed program can reach; this filter shrinks the kernel
surface it can poke at, the way container runtimes' default profiles do. It is a deny-list, so
ordinary programs (shells, compilers, Python, git) run unchanged: the listed calls are those
that only debuggers, system administration or kernel exploits use. They fail with EPERM, as
under Docker's default profile, so programs that probe for them fall back cleanly.

The program is compiled once with libseccomp (through `pyseccomp`) for this machine's native
architecture; system calls of another ABI (i386 or x32 on x86-64) kill the caller, which closes
the usual way around an x86-64 filter. bwrap loads it with `--seccomp FD` after setting up the
jail and before running the program, so it binds everything the program starts.
"""

from __future__ import annotations

import errno
import os
import tempfile

from agentmesh.logs import get_logger

log = get_logger("agentmesh.tools.sandbox")

DENIED_SYSCALLS = (
    # Reading and steering other processes.
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    # The kernel keyring, eBPF, perf counters, userfaultfd: frequent exploit primitives.
    "add_key", "request_key", "keyctl", "bpf", "perf_event_open", "userfaultfd",
    # io_uring bypasses per-syscall filtering and has a long record of kernel bugs.
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    # New namespaces and mounts: the jail's layout is final.
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree",
    "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    # Escaping path checks through file handles.
    "open_by_handle_at", "name_to_handle_at",
    # Machine administration.
    "reboot", "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "swapon", "swapoff", "acct", "quotactl", "syslog", "settimeofday", "clock_settime",
    "clock_adjtime", "adjtimex", "ioperm", "iopl", "lookup_dcookie", "fanotify_init", "nfsservctl",
    "vhangup",
)  # fmt: skip

# Calls that answer EOPNOTSUPP instead, as on a file system without them. `fallocate` takes disk
# without writing it: gigabytes per system call, far faster than the workspace quota's watch can
# look. Programs treat EOPNOTSUPP as "not here" (glibc's posix_fallocate writes the blocks instead),
# so space is only taken at the speed of writing.
UNSUPPORTED_SYSCALLS = ("fallocate",)


def compile_filter() -> bytes | None:
    """The BPF program bwrap loads, or None (with a warning) when libseccomp is not available."""
    try:
        import pyseccomp as seccomp
    except (ImportError, RuntimeError, OSError) as exc:
        log.warning(
            "libseccomp not found: jailed programs run without a seccomp filter "
            "(Debian/Ubuntu: apt-get install libseccomp2)",
            error=str(exc),
        )
        return None
    program = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    for name in DENIED_SYSCALLS:
        # Calls this architecture does not have (iopl on arm64) resolve to an error: skip them.
        if seccomp.resolve_syscall(seccomp.Arch.NATIVE, name) == -1:
            continue
        program.add_rule(seccomp.ERRNO(errno.EPERM), name)
    for name in UNSUPPORTED_SYSCALLS:
        program.add_rule(seccomp.ERRNO(errno.EOPNOTSUPP), name)
    with tempfile.TemporaryFile() as out:
        program.export_bpf(out)
        out.seek(0)
        return out.read()


def filter_fd(program: bytes) -> int:
    """A fresh readable descriptor holding the program; bwrap reads it to the end, so one per jail."""
    fd = os.memfd_create("agentmesh-seccomp", os.MFD_CLOEXEC)
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
