"""The workspace quota inside a sandbox pod: a POSIX shell wrapper around the call's command.

Kubernetes has nothing that bounds a PersistentVolumeClaim's sub-path: `ephemeral-storage`
limits count the container's writable layer, logs and emptyDirs, never a PVC, and an emptyDir's
`sizeLimit` is enforced by kubelet eviction, seconds late. So the pod's command becomes

    /bin/sh -c WRAPPER agentmesh-quota QUOTA_KIB FILE_LIMIT_KIB -- ARGV...

which measures the workspace (`du -skx .`), sets `ulimit -f` to what the quota leaves (no file
may outgrow it: the kernel stops one writer at once, and the program cannot raise a hard
limit), runs the program, and watches the total from a background loop that kills the program
when the workspace grows past the quota (ten looks a second; a call that starts over the quota
may still delete). The wrapper then measures once more and, over the quota, says
so on stderr behind `MARKER` and exits `QUOTA_EXIT` (122, EDQUOT), which the executor reports as
`disk_quota`.

The loop runs as the program's own uid, so a hostile program can kill or stop it; it is the fast
path for runaway programs. The bound a program cannot touch is the tools service's own watch of
the same claim (`kubernetes.py`), which deletes the Job. In a real pod the wrapper is PID 1: when
it exits the kernel ends every process in the pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentmesh.tools.quota import UsageMeter, WorkspaceQuota
    from agentmesh.tools.sandbox.base import CommandResult

QUOTA_EXIT = 122
MARKER = "agentmesh: disk quota:"
POLL_S = 0.1

# $1 quota (KiB), $2 per-file limit (KiB), then "--" and the program.
WRAPPER = f"""\
q=$1 f=$2; shift 3
used() {{ u=$(du -skx . 2>/dev/null); echo "${{u%%[!0-9]*}}"; }}
before=$(used); before=${{before:-0}}
left=$((q - before)); [ "$left" -gt 0 ] || left=0
lim=$f lowered=0; if [ "$left" -lt "$f" ]; then lim=$left lowered=1; fi
ulimit -f $((lim * 2))
if command -v setsid >/dev/null 2>&1; then setsid "$@" & else "$@" & fi
pid=$!
(
  while sleep {POLL_S}; do
    u=$(used)
    if [ -z "$u" ] || {{ [ "$u" -gt "$q" ] && [ "$u" -gt "$before" ]; }}; then kill -KILL -"$pid" 2>/dev/null; kill -KILL "$pid" 2>/dev/null; exit 0; fi
  done
) </dev/null >/dev/null 2>&1 &
watch=$!
wait "$pid"; status=$?
kill -KILL "$watch" -"$pid" 2>/dev/null
after=$(used); after=${{after:-0}}
if [ "$after" -gt "$q" ] && [ "$after" -gt "$before" ]; then
  echo "{MARKER} the session's workspace holds $after KiB, over its $q KiB quota" >&2; exit {QUOTA_EXIT}
fi
if [ "$status" -eq 153 ] && [ "$lowered" -eq 1 ]; then
  echo "{MARKER} a file reached the $lim KiB the quota left (the workspace held $before KiB of its $q KiB quota)" >&2; exit {QUOTA_EXIT}
fi
exit "$status"
"""


def kib(size: int) -> int:
    return max(size // 1024, 0)


def quota_command(argv: tuple[str, ...] | list[str], quota_bytes: int, file_size_bytes: int) -> list[str]:
    """The container command that runs `argv` under the workspace quota."""
    return ["/bin/sh", "-c", WRAPPER, "agentmesh-quota", str(kib(quota_bytes)), str(kib(file_size_bytes)), "--", *argv]


def quota_message(log_text: str) -> str:
    """The wrapper's sentence from a pod's log, or "" when it did not stop for the quota."""
    for line in reversed(log_text.splitlines()):
        if line.startswith(MARKER):
            return line[len(MARKER) :].strip()
    return ""


async def name_pod_quota(result: CommandResult, wrapper_output: str, workspace: Path | None, used_before: int,
                         meter: UsageMeter, quota: WorkspaceQuota) -> None:
    """Name the quota when a pod's wrapper stopped for it (its sentence in `wrapper_output`), or the
    call left the claim over it; a Job pod and a session pod's exec alike."""
    if result.error_kind == "disk_quota":
        usage = await meter.usage(workspace) if workspace is not None else 0
        result.data.update(quota_bytes=quota.limit_bytes, usage_bytes=usage)
        return
    if result.error_kind:
        return
    wrapper_said = quota_message(wrapper_output) if result.exit_code == QUOTA_EXIT else ""
    usage = await meter.usage(workspace) if workspace is not None else 0
    if wrapper_said:
        result.error_kind = "disk_quota"
        result.detail = f"the workspace quota was reached: {wrapper_said}; delete files you no longer need (`rm`) to write again"
    elif workspace is not None and quota.over(usage) and usage > used_before:
        result.error_kind = "disk_quota"
        result.detail = quota.exceeded_detail(usage, stopped=False)
    else:
        return
    result.data.update(quota_bytes=quota.limit_bytes, usage_bytes=usage)


async def claim_over_quota(meter: UsageMeter, quota: WorkspaceQuota, workspace: Path, used_before: int,
                           interval_s: float) -> int:
    """The workspace's usage once it grows past the quota: the tools service's own look at the
    shared claim while a call runs in a session pod (every `interval_s`, or four times as long as
    a walk takes)."""
    interval = interval_s
    while True:
        await asyncio.sleep(interval)
        began = time.monotonic()
        with contextlib.suppress(OSError):
            usage = await meter.usage(workspace)
            if quota.over(usage) and usage > used_before:
                return usage
        interval = max(interval_s, 4 * (time.monotonic() - began))
