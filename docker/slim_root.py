"""Assemble the services image's root file system: the Python runtime, one venv, nothing else.

Run inside the build stage with the interpreter the venv was made from:

    python3 docker/slim_root.py /opt/agentmesh /rootfs

It copies into ROOTFS the interpreter, its standard library (less tests, IDLE, tkinter and
ensurepip), the venv, every shared library any of their ELF files loads (found with ldd, the
dynamic loader included), CA certificates, and a passwd/group naming the service user. No
shell, no coreutils, no package manager: `agentmesh serve` is the only program in the image.
Works on any glibc base whose python3 made the venv (Debian's own, or python:3.11-slim).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

UID = GID = 10001
STDLIB_SKIP = frozenset({"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data"})
# Data a program may read at run time that ldd cannot see.
DATA = ["/etc/ssl/certs/ca-certificates.crt", "/etc/ssl/openssl.cnf", "/usr/lib/ssl"]
LDD_LINE = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x[0-9a-f]+\)")


class RootBuilder:
    def __init__(self, root: Path):
        self.root = root
        self.copied: set[str] = set()

    def target(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def copy(self, path: str, skip: frozenset[str] = frozenset()) -> None:
        """Copy `path` as it is (a symlink stays a symlink; its target is copied too).

        `skip`: names left out anywhere below a copied directory."""
        if path in self.copied or not os.path.lexists(path):
            return
        self.copied.add(path)
        parent = os.path.dirname(path)
        real_parent = os.path.realpath(parent)
        if real_parent != parent:
            # e.g. /lib -> usr/lib on merged-/usr systems: recreate the link, copy via the real path.
            self.copy_link_chain(parent)
            self.copy(os.path.join(real_parent, os.path.basename(path)), skip)
            return
        dest = self.target(path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if os.path.islink(path):
            link = os.readlink(path)
            if not dest.is_symlink():
                dest.symlink_to(link)
            self.copy(os.path.normpath(os.path.join(parent, link)))
        elif os.path.isdir(path):
            shutil.copytree(path, dest, symlinks=True, dirs_exist_ok=True, ignore=lambda _, names: skip.intersection(names))
        else:
            shutil.copy2(path, dest)

    def copy_link_chain(self, path: str) -> None:
        """Recreate every symlinked directory on the way to `path` (/lib, /lib64, /bin ...)."""
        current = "/"
        for part in Path(path).parts[1:]:
            current = os.path.join(current, part)
            if os.path.islink(current):
                dest = self.target(current)
                if not dest.is_symlink():
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.symlink_to(os.readlink(current))
                current = os.path.realpath(current)

    def copy_libraries_of(self, tree: Path | str) -> None:
        """Every shared library the ELF files under `tree` (or the file itself) load."""
        files = [Path(tree)] if Path(tree).is_file() else [p for p in Path(tree).rglob("*") if p.is_file() and not p.is_symlink()]
        for path in files:
            with open(path, "rb") as f:
                if f.read(4) != b"\x7fELF":
                    continue
            listing = subprocess.run(["ldd", str(path)], capture_output=True, text=True).stdout
            for library in LDD_LINE.findall(listing):
                self.copy(library)


def write_identity(root: Path) -> None:
    etc = root / "etc"
    etc.mkdir(exist_ok=True)
    (etc / "passwd").write_text(
        "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"agentmesh:x:{UID}:{GID}:agentmesh:/var/lib/agentmesh:/usr/sbin/nologin\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    )
    (etc / "group").write_text(f"root:x:0:\nagentmesh:x:{GID}:\nnogroup:x:65534:\n")
    (etc / "nsswitch.conf").write_text("passwd: files\ngroup: files\nhosts: files dns\n")
    tmp = root / "tmp"
    tmp.mkdir(exist_ok=True)
    tmp.chmod(0o1777)
    home = root / "var/lib/agentmesh"
    home.mkdir(parents=True, exist_ok=True)
    home.chmod(0o750)
    os.chown(home, UID, GID)


def main(venv: str, rootfs: str) -> None:
    builder = RootBuilder(Path(rootfs))
    interpreter = os.path.realpath(sys.executable)
    builder.copy_link_chain(interpreter)
    builder.copy(interpreter)
    # The venv's python -> the base's python3 -> python3.11: copy each link on the way.
    link = os.path.join(venv, "bin", "python3")
    while os.path.islink(link):
        target = os.path.normpath(os.path.join(os.path.dirname(link), os.readlink(link)))
        builder.copy(target)
        link = target
    stdlib = sysconfig.get_paths()["stdlib"]
    builder.copy(stdlib, STDLIB_SKIP)
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        builder.copy(os.path.join(sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")))
    builder.copy(venv)
    for path in DATA:
        builder.copy(path)
    for tree in (interpreter, stdlib, venv):
        builder.copy_libraries_of(tree)
    write_identity(Path(rootfs))
    print(f"{rootfs}: {len(builder.copied)} paths copied", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: slim_root.py VENV ROOTFS")
    main(sys.argv[1], sys.argv[2])
