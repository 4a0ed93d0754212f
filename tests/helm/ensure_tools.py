"""Provide checkov for the chart tests, in its own virtualenv.

checkov pins old versions of packages agentmesh also uses (packaging, python-dateutil, ...), so it
cannot live in the project's `.venv`. The first run creates `.venv-checkov` at the repository
root and installs the pinned version from PyPI (about a minute); later runs reuse it.

    python tests/helm/ensure_tools.py          # prints the checkov executable, creating it if needed

`AGENTMESH_CHECKOV=/path/to/checkov` uses an existing executable instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

CHECKOV_VERSION = "3.3.30"
REPO_ROOT = Path(__file__).resolve().parents[2]
CHECKOV_VENV = REPO_ROOT / ".venv-checkov"
_MARKER = CHECKOV_VENV / ".installed"


class ToolUnavailable(RuntimeError):
    """checkov could not be provided; the message says why and what to try."""


def _checkov_in(env: Path) -> Path:
    return env / ("Scripts/checkov.cmd" if os.name == "nt" else "bin/checkov")


def _installed() -> bool:
    return _MARKER.is_file() and _MARKER.read_text().strip() == CHECKOV_VERSION and _checkov_in(CHECKOV_VENV).exists()


def ensure_checkov() -> Path:
    override = os.environ.get("AGENTMESH_CHECKOV", "").strip()
    if override:
        path = Path(override)
        if not path.exists():
            raise ToolUnavailable(f"AGENTMESH_CHECKOV points at {path}, which does not exist")
        return path
    if _installed():
        return _checkov_in(CHECKOV_VENV)
    # Two test processes may get here at once; the second waits for the first's install.
    from filelock import FileLock

    CHECKOV_VENV.mkdir(exist_ok=True)
    # The venv ignores itself (lock included), so it never shows up in `git status`.
    (CHECKOV_VENV / ".gitignore").write_text("*\n")
    with FileLock(str(CHECKOV_VENV / ".install.lock"), timeout=600):
        if _installed():
            return _checkov_in(CHECKOV_VENV)
        if not (CHECKOV_VENV / "pyvenv.cfg").exists():
            venv.EnvBuilder(with_pip=True).create(CHECKOV_VENV)
        python = CHECKOV_VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
        result = subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", f"checkov=={CHECKOV_VERSION}"],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
            raise ToolUnavailable(
                f"installing checkov=={CHECKOV_VERSION} into {CHECKOV_VENV} failed (is PyPI reachable?):\n{tail}"
            )
        _MARKER.write_text(CHECKOV_VERSION + "\n")
    return _checkov_in(CHECKOV_VENV)


if __name__ == "__main__":
    try:
        print(ensure_checkov())
    except ToolUnavailable as exc:
        print(exc, file=sys.stderr)
        sys.exit(1)
