"""Path handling inside a workspace, at the level of the functions every file tool goes through."""

from __future__ import annotations

import os

import pytest

from agentmesh.tools.beneath import open_beneath, walk_beneath
from agentmesh.tools.results import ToolFailure
from agentmesh.tools.workspace import resolve_inside


@pytest.fixture
def workspace(tmp_path):
    ws = tmp_path / "ws"
    (ws / "a").mkdir(parents=True)
    (ws / "a" / "b.txt").write_text("inside")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "b.txt").write_text("outside")
    return ws


@pytest.mark.parametrize("path", ["a/b.txt", "/workspace/a/b.txt", "a/../a/b.txt", "./a/b.txt"])
def test_paths_inside_resolve(workspace, path):
    assert resolve_inside(workspace, path) == (workspace / "a" / "b.txt").resolve()


@pytest.mark.parametrize("path", ["..", "../outside/b.txt", "a/../../outside/b.txt", "/etc/passwd", "/workspace/../etc/passwd"])
def test_paths_outside_are_refused(workspace, path):
    with pytest.raises(ToolFailure) as failure:
        resolve_inside(workspace, path)
    assert failure.value.kind == "path_escape"


def test_a_directory_swapped_for_a_symlink_after_the_check_is_not_followed(workspace):
    real = resolve_inside(workspace, "a/b.txt")  # checked while `a` is a real directory
    os.rename(workspace / "a", workspace / "a-moved")
    os.symlink(workspace.parent / "outside", workspace / "a")  # ... then swapped, as a racing program could
    with pytest.raises(ToolFailure) as failure:
        open_beneath(workspace, real, os.O_RDONLY)
    assert failure.value.kind == "path_escape"
    with pytest.raises(ToolFailure):
        open_beneath(workspace, real, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    assert (workspace.parent / "outside" / "b.txt").read_text() == "outside"


def test_a_file_swapped_for_a_symlink_is_not_followed(workspace):
    real = resolve_inside(workspace, "a/b.txt")
    os.unlink(real)
    os.symlink(workspace.parent / "outside" / "b.txt", real)
    with pytest.raises(ToolFailure):
        open_beneath(workspace, real, os.O_RDONLY)


def test_walks_list_symlinks_but_never_enter_them(workspace):
    os.symlink(workspace.parent / "outside", workspace / "link")
    paths = {e.path: e.kind for e in walk_beneath(workspace, workspace)}
    assert paths == {"a": "dir", "a/b.txt": "file", "link": "symlink"}


def test_a_fifo_swapped_in_for_a_file_is_refused_without_blocking(workspace):
    real = resolve_inside(workspace, "a/b.txt")
    os.unlink(real)
    os.mkfifo(real)  # opening it for reading would wait for a writer forever
    with pytest.raises(ToolFailure) as failure:
        open_beneath(workspace, real, os.O_RDONLY)
    assert failure.value.kind == "not_a_file"
    with pytest.raises(ToolFailure):
        open_beneath(workspace, real, os.O_WRONLY | os.O_TRUNC)
    assert [e.path for e in walk_beneath(workspace, workspace) if e.kind == "other"] == ["a/b.txt"]
