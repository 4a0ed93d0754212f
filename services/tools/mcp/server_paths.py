"""What a stdio MCP server needs from the host to start in the local jail, found from its command.

The jail shares the host's /usr and nothing else of its file system: /tmp is the jail's own,
/opt, /home and a pipx or uv install are not there. A server installed in a virtual environment
under one of those died at its first instruction ("Connection closed") unless its entry listed
the right `mounts`. So the command is followed to what it runs: the file itself and, through
symlinks, its real location; a script's `#!` interpreter likewise; the virtual environment
each lies in (the directory holding `pyvenv.cfg`) and the installation of the Python it was
made from (`home` in pyvenv.cfg, or an interpreter's own prefix); the directories the
environment's `.pth` files add to the import path (editable installs). Each is bound read-only
at its own path. Never bound: the root, the service's own home (its keys), or a directory that
holds it — a server installed there keeps needing an explicit, narrower `mounts`.
"""

from __future__ import annotations

import os
from pathlib import Path

SHARED = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
_SHEBANG_BYTES = 256
_MAX_PTH_LINES = 64


def server_binds(command: str, private: Path | None = None) -> tuple[str, ...]:
    """Host paths to bind read-only for `command` (an absolute path), without those the jail
    already has and without anything at or above `private` (the service's home)."""
    found: list[str] = []
    for program in _programs(command):
        for path in (program, os.path.realpath(program)):
            venv = _venv_root(path)
            if venv is not None:
                found.append(venv)
                found.extend(_venv_base(venv))
                found.extend(_pth_dirs(venv))
            else:
                found.append(_install_root(path))
    return _narrowed(found, private)


def _programs(command: str) -> list[str]:
    """The command and the interpreter its `#!` line names (`/usr/bin/env X` is left to PATH,
    which in the jail is the system's)."""
    programs = [command]
    try:
        with open(command, "rb") as file:
            head = file.read(_SHEBANG_BYTES)
    except OSError:
        return programs
    if head.startswith(b"#!"):
        words = head[2:].split(b"\n", 1)[0].split()
        if words and words[0].startswith(b"/") and not words[0].endswith(b"/env"):
            programs.append(os.fsdecode(words[0]))
    return programs


def _venv_root(path: str) -> str | None:
    for parent in Path(path).parents:
        if (parent / "pyvenv.cfg").is_file():
            return str(parent)
        if parent.name != "bin" and parent.parent.name != "bin":
            break  # a venv's programs are in <venv>/bin: look no higher than that
    return None


def _venv_base(venv: str) -> list[str]:
    """The installation the environment's Python comes from: pyvenv.cfg's `home` is its bin."""
    try:
        lines = (Path(venv) / "pyvenv.cfg").read_text(errors="replace").splitlines()
    except OSError:
        return []
    for line in lines:
        key, _, value = line.partition("=")
        if key.strip() == "home" and os.path.isabs(value.strip()):
            home = os.path.realpath(value.strip())
            return [_install_root(os.path.join(home, "python"))]
    return []


def _pth_dirs(venv: str) -> list[str]:
    """Directories the environment's .pth files put on the import path (not their `import` lines)."""
    dirs: list[str] = []
    for pth in Path(venv).glob("lib/python3*/site-packages/*.pth"):
        try:
            lines = pth.read_text(errors="replace").splitlines()[:_MAX_PTH_LINES]
        except OSError:
            continue
        dirs += [line.strip() for line in lines if line.startswith("/") and os.path.isdir(line.strip())]
    return dirs


def _install_root(path: str) -> str:
    """`<prefix>` for a program in `<prefix>/bin`, else the program file itself."""
    parent = os.path.dirname(path)
    if os.path.basename(parent) == "bin" and os.path.isdir(os.path.join(os.path.dirname(parent), "lib")):
        return os.path.dirname(parent)
    return path


def _narrowed(paths: list[str], private: Path | None) -> tuple[str, ...]:
    keep: list[str] = []
    private_real = os.path.realpath(private) if private is not None else None
    for given in paths:
        path = os.path.normpath(given)
        if path == "/" or not os.path.exists(path) or _under_any(path, SHARED):
            continue
        if private_real is not None and (_under_any(private_real, (path,)) or _under_any(path, (private_real,))):
            continue
        if path not in keep:
            keep.append(path)
    # A path inside another one kept is bound with it.
    return tuple(p for p in keep if not any(other != p and _under_any(p, (other,)) for other in keep))


def _under_any(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)
