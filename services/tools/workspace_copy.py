"""A forked session's workspace: a copy of its source's as it is (Tools.CopyWorkspace).

The copy is refused, before anything is written, when the source holds more than one workspace
may (the per-session quota, AGENTMESH_TOOLS_WORKSPACE_QUOTA_MB and _FILES): the fork would start
over its quota. A copy that fails part-way is removed, so a failed fork leaves no workspace.
"""

from __future__ import annotations

import asyncio

from agentmesh import error_reasons
from agentmesh.errors import AlreadyExists, InvalidArgument, ResourceExhausted
from agentmesh.ids import validate_id
from agentmesh.tools.quota import TooManyEntries, WorkspaceQuota, measure_workspace, mib
from agentmesh.tools.tree_copy import Copied, copy_tree
from agentmesh.tools.tree_delete import remove_tree
from agentmesh.tools.workspace import Workspaces

__all__ = ["copy_workspace"]


async def copy_workspace(workspaces: Workspaces, quota: WorkspaceQuota, from_session: str, to_session: str) -> Copied:
    validate_id(from_session, "from_session_id")
    validate_id(to_session, "to_session_id")
    if from_session == to_session:
        raise InvalidArgument("from_session_id and to_session_id are the same session", field="to_session_id")
    return await asyncio.to_thread(_copy, workspaces, quota, from_session, to_session)


def _copy(workspaces: Workspaces, quota: WorkspaceQuota, from_session: str, to_session: str) -> Copied:
    source, target = workspaces.path(from_session), workspaces.path(to_session)
    if target.exists() or target.is_symlink():
        raise AlreadyExists(f"session {to_session!r} has a workspace already; a fork starts with none",
                            metadata={"session_id": to_session})
    if not source.is_dir() or source.is_symlink():
        workspaces.ensure(to_session)
        return Copied()
    try:
        usage = measure_workspace(source, max_entries=(quota.limit_files or 0) + 1 if quota.limit_files else None)
    except TooManyEntries:
        usage = None
    if usage is None or quota.over(usage.bytes) or quota.files_over(usage.files):
        held = f"{mib(usage.bytes)} in {usage.files} files" if usage else f"more than {quota.limit_files} files"
        raise ResourceExhausted(
            f"session {from_session!r}'s workspace holds {held}, more than a session's workspace may "
            f"({mib(quota.limit_bytes)}, {quota.limit_files or 'any number of'} files); delete files in it before forking",
            reason=error_reasons.QUOTA_EXCEEDED, metadata={"limit": "workspace_quota"})
    try:
        return copy_tree(source, target, workspaces.adopt_fd if workspaces.owner is not None else None)
    except BaseException:
        if target.is_dir() and not target.is_symlink():
            remove_tree(target)
        raise
