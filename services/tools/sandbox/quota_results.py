"""A finished call's result told in terms of the workspace quota: `disk_quota` when the quota is
what ended it, or what it ran into (every executor that watches a workspace uses these)."""

from __future__ import annotations

from agentmesh.tools.quota import WorkspaceQuota
from agentmesh.tools.sandbox.base import CommandResult

__all__ = ["apply_file_quota", "apply_quota"]


def apply_quota(
    result: CommandResult, quota: WorkspaceQuota, used_before: int, used_after: int, lowered_file_limit: bool, *, stopped: bool
) -> None:
    """Say `disk_quota` when the workspace quota is what ended the call, or what it ran into.

    `stopped`: the watch killed the jail for it. `lowered_file_limit`: the per-file limit was cut
    to what the quota left, so a file-size stop means the quota. Otherwise a call that ended on its
    own but grew the workspace to its quota or past it (a writer cut at the per-file limit whose
    shell went on, a write between two looks of the watch) says so.
    What was written stays: deleting some of it would be a guess at which files matter; the next
    call's per-file limit is 0 and file tools refuse to add, until the session frees space.
    """
    if stopped:
        result.error_kind = "disk_quota"
        result.detail = quota.exceeded_detail(used_after, stopped=True)
    elif result.error_kind == "file_size_limit" and lowered_file_limit:
        result.error_kind = "disk_quota"
        result.detail = quota.file_limit_detail(used_before)
    elif not result.error_kind and used_after >= quota.limit_bytes and used_after > used_before:
        result.error_kind = "disk_quota"
        result.detail = quota.exceeded_detail(used_after, stopped=False)
    else:
        return
    result.data.update(quota_bytes=quota.limit_bytes, usage_bytes=used_after)


def apply_file_quota(result: CommandResult, quota: WorkspaceQuota, files_before: int, files_after: int, *,
                     stopped: bool) -> None:
    """Say `disk_quota` when the workspace's file limit ended the call (`stopped`), or when the
    call, ending on its own, left more files than the limit and more than it found. No kernel
    limit counts a directory's files, so a call may make some past the limit before the watch's
    next look; they stay, and file tools refuse new files until the session deletes some."""
    if stopped:
        result.detail = quota.files_detail(files_after, stopped=True)
    elif not result.error_kind and quota.files_over(files_after) and files_after > files_before:
        result.detail = quota.files_detail(files_after, stopped=False)
    else:
        return
    result.error_kind = "disk_quota"
    result.data.update(quota_files=quota.limit_files, usage_files=files_after)
