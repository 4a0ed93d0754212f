"""Provide checkov for the chart tests, in its own virtualenv.

checkov pins old versions of packages agentmesh also uses (packaging, python-dateutil, ...), so it
cannot live in the project's `.venv`. The first run creates `.venv-checkov` at the repository
root and installs checkov with every dependency pinned (checkov-requirements.txt) from PyPI;
that takes a minute or two, later runs reuse it. The venv ignores itself in git.

    python tests/helm/ensure_tools.py          # prints the checkov executable, creating it if needed

`AGENTMESH_CHECKOV=/path/to/checkov` uses an existing executable instead.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import venv
from concurrent.futures import Future
from pathlib import Path

CHECKOV_VERSION = "3.3.30"
HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "checkov-requirements.txt"
REPO_ROOT = HERE.parents[1]
CHECKOV_VENV = REPO_ROOT / ".venv-checkov"
_MARKER = CHECKOV_VENV / ".installed"


class ToolUnavailable(RuntimeError):
    """checkov could not be provided; the message says why and what to try."""


def _bin(name: str) -> Path:
    return CHECKOV_VENV / ("Scripts" if os.name == "nt" else "bin") / name


def _stamp() -> str:
    # Reinstall when the pins change.
    return f"{CHECKOV_VERSION} {hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:16]}"


def _installed() -> bool:
    return _MARKER.is_file() and _MARKER.read_text().strip() == _stamp() and _bin("checkov").exists()


def _pip(*args: str) -> subprocess.CompletedProcess:
    # --no-compile: byte-compiling botocore & co. costs more than it saves for one scan per run.
    return subprocess.run(
        [str(_bin("python")), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile", *args],
        capture_output=True,
        text=True,
    )


def ensure_checkov() -> Path:
    override = os.environ.get("AGENTMESH_CHECKOV", "").strip()
    if override:
        path = Path(override)
        if not path.exists():
            raise ToolUnavailable(f"AGENTMESH_CHECKOV points at {path}, which does not exist")
        return path
    if _installed():
        return _bin("checkov")
    from filelock import FileLock

    CHECKOV_VENV.mkdir(exist_ok=True)
    (CHECKOV_VENV / ".gitignore").write_text("*\n")
    # Two processes (or the background start and a test) may get here at once; one installs.
    with FileLock(str(CHECKOV_VENV / ".install.lock"), timeout=900):
        if _installed():
            return _bin("checkov")
        if not (CHECKOV_VENV / "pyvenv.cfg").exists():
            venv.EnvBuilder(with_pip=True).create(CHECKOV_VENV)
        result = _pip("-r", str(REQUIREMENTS))
        if result.returncode != 0:
            # The exact pins may lack a wheel for this platform: let pip resolve checkov itself.
            result = _pip(f"checkov=={CHECKOV_VERSION}")
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
            raise ToolUnavailable(
                f"installing checkov=={CHECKOV_VERSION} into {CHECKOV_VENV} failed (is PyPI reachable?):\n{tail}"
            )
        _MARKER.write_text(_stamp() + "\n")
    return _bin("checkov")


_background: Future | None = None
_background_lock = threading.Lock()


def ensure_checkov_in_background() -> Future:
    """Start ensure_checkov() on a thread (once) so the install overlaps other tests."""
    global _background
    with _background_lock:
        if _background is None:
            future: Future = Future()

            def run() -> None:
                try:
                    future.set_result(ensure_checkov())
                except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
                    future.set_exception(exc)

            threading.Thread(target=run, name="ensure-checkov", daemon=True).start()
            _background = future
        return _background


if __name__ == "__main__":
    try:
        print(ensure_checkov())
    except ToolUnavailable as exc:
        print(exc, file=sys.stderr)
        sys.exit(1)
