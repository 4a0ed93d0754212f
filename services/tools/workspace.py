"""Per-session workspaces under `$AGENTMESH_HOME/workspaces/<session_id>`, and paths inside them.

Every path a model gives is resolved here: relative to the workspace (or absolute under the
jail's view, `/workspace/...`), symlinks followed, and the result must still lie inside the
workspace. `..` that climbs out, absolute paths elsewhere and symlinks that point out are refused.
Files are then opened component by component without following symlinks (`beneath.py`), so a
symlink swapped in after the check is not followed either.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from agentmesh.ids import validate_id
from agentmesh.tools.results import ToolFailure
from agentmesh.tools.tree_delete import remove_tree

JAIL_PREFIX = PurePosixPath("/workspace")


class Workspaces:
    """`owner`: (uid, gid) that workspaces and files made by the service belong to, when jailed
    programs run as a different host user than the service (a root service drops them to nobody)."""

    def __init__(self, root: Path, owner: tuple[int, int] | None = None):
        self.root = Path(root)
        self.owner = owner

    def path(self, session_id: str) -> Path:
        """The workspace directory of a session (validated id; may not exist yet)."""
        return self.root / validate_id(session_id)

    def ensure(self, session_id: str) -> Path:
        workspace = self.path(session_id)
        if not workspace.is_dir():
            workspace.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.adopt(workspace)
        return workspace

    def adopt(self, path: Path) -> None:
        """Give a file or directory the service created to the jail's user, so programs can change it."""
        if self.owner is not None:
            os.chown(path, *self.owner, follow_symlinks=False)

    def adopt_fd(self, fd: int) -> None:
        if self.owner is not None:
            os.fchown(fd, *self.owner)

    def delete(self, session_id: str) -> bool:
        workspace = self.path(session_id)
        if not workspace.exists() and not workspace.is_symlink():
            return False
        if workspace.is_symlink() or not workspace.is_dir():
            workspace.unlink()
            return True
        # Without recursion (a tree may be thousands deep), never following a symlink inside, so
        # links to elsewhere cannot widen the delete; locked directories (chmod 0) are opened up.
        remove_tree(workspace)
        return True

    def resolve(self, session_id: str, user_path: str) -> tuple[Path, Path]:
        """Return (workspace, real path) for `user_path`, or raise ToolFailure("path_escape")."""
        workspace = self.ensure(session_id)
        return workspace, resolve_inside(workspace, user_path)


def resolve_inside(workspace: Path, user_path: str) -> Path:
    if "\x00" in user_path:
        raise ToolFailure("invalid_arguments", "the path contains a NUL byte")
    raw = PurePosixPath(user_path or ".")
    if raw.is_absolute():
        try:
            raw = raw.relative_to(JAIL_PREFIX)
        except ValueError:
            raise ToolFailure(
                "path_escape",
                f"{user_path!r} is outside the workspace: use a path relative to the workspace "
                "(or under /workspace, which is where commands see it)",
            ) from None
    root = os.path.realpath(workspace)
    real = os.path.realpath(os.path.join(root, str(raw)))
    if real != root and not real.startswith(root + os.sep):
        raise ToolFailure(
            "path_escape",
            f"{user_path!r} resolves outside the workspace (through '..' or a symlink); "
            "only files inside the workspace can be used",
        )
    return Path(real)


def display_path(workspace: Path, real: Path) -> str:
    """How a resolved path is shown back to the model: relative to the workspace."""
    rel = os.path.relpath(real, os.path.realpath(workspace))
    return "." if rel == "." else rel
