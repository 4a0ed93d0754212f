"""`make install`'s system packages (scripts/system-packages.sh): bubblewrap and libseccomp2 are
installed when missing and it can (root, passwordless sudo); otherwise it stops with the one
command that installs them. The script runs for real; what stands in is the machine: a PATH
without `bwrap` (and a recording `apt-get` where it would install)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "system-packages.sh"
# An interpreter any user may run (the venv's may live under root's home).
PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable


@pytest.fixture
def bare_path():
    """A PATH directory with only `id` in it: no bwrap, no sudo, no apt-get. World-readable,
    so an unprivileged user can use it too."""
    path = Path(tempfile.mkdtemp(prefix="agentmesh-bare-path-"))
    path.chmod(0o755)
    (path / "id").symlink_to(shutil.which("id"))
    yield path
    shutil.rmtree(path)


def run_script(path: Path, *, as_nobody: bool = False) -> subprocess.CompletedProcess:
    prefix = [shutil.which("setpriv") or "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if as_nobody else []
    return subprocess.run([*prefix, "/bin/bash", str(SCRIPT), PYTHON], env={"PATH": str(path)},
                          capture_output=True, text=True, timeout=60)


def test_without_bwrap_and_without_root_it_stops_with_the_command_that_installs_it(bare_path):
    if os.geteuid() == 0 and not shutil.which("setpriv"):
        pytest.skip("needs setpriv to run as an unprivileged user")
    result = run_script(bare_path, as_nobody=os.geteuid() == 0)
    assert result.returncode == 1
    assert "sudo apt-get install -y bubblewrap" in result.stderr
    assert "then run `make install` again" in result.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="installing needs root")
def test_without_bwrap_as_root_it_installs_bubblewrap_with_apt_get(bare_path):
    calls = bare_path / "apt-get-calls"
    fake = bare_path / "apt-get"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    result = run_script(bare_path)
    assert result.returncode == 0, result.stderr
    lines = calls.read_text().splitlines()
    assert lines[0].startswith("update")
    assert lines[1].startswith("install -y") and "bubblewrap" in lines[1].split()


def test_with_everything_present_it_changes_nothing(bare_path):
    bwrap = shutil.which("bwrap")
    if not bwrap:
        pytest.skip("this machine has no bubblewrap")
    (bare_path / "bwrap").symlink_to(bwrap)
    for tool in ("slirp4netns", "ip"):  # egress's helpers (their absence is tested with bwrap's)
        found = shutil.which(tool, path="/usr/bin:/bin:/usr/sbin:/sbin")
        if not found:
            pytest.skip(f"this machine has no {tool}")
        (bare_path / tool).symlink_to(found)
    calls = bare_path / "apt-get-calls"
    fake = bare_path / "apt-get"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    fake.chmod(0o755)
    result = run_script(bare_path)
    assert result.returncode == 0, result.stderr
    assert not calls.exists()
