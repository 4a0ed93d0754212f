"""Installing an `npx`/`uvx` entry's package once, in a one-shot jail that has network (packages.py).

The fetch is the only step of such a server that reaches the network: a jail like a command
tool's, its /workspace the package cache (`<root>/packages/`: the deployment's servers share one,
each namespace has its own), with a sandbox template's user-mode network (`network: egress`,
egress.py: the internet and what AGENTMESH_SANDBOX_EGRESS_ALLOW opens, never the host or private
ranges) — or the host's network for an entry that says `"network": true` (the server gets it too).
The server itself then runs with no network at all from the install, bound read-only. A fetch is
made once per package and source: the install directory holds a mark with the program to run,
and a later start (a restart, the next service start) runs that without asking anyone.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from agentmesh.tools.mcp.config import SYSTEM_PATH, McpServerEntry
from agentmesh.tools.mcp.packages import FETCHED_MARK, PackageSpec, fetch_command, fetch_env, installed_command
from agentmesh.tools.sandbox.base import CommandSpec
from agentmesh.tools.sandbox.egress import EgressUnavailable, UserNetwork, attach_network, finish_network
from agentmesh.tools.sandbox.jail_watch import JailInfo
from agentmesh.tools.sandbox.local import SANDBOX_PATH, LocalJail
from agentmesh.tools.sandbox.process import run_process
from agentmesh.tools.sandbox.seccomp import filter_fd
from agentmesh.tools.sandbox.templates import SandboxTemplate

__all__ = ["FetchFailed", "Installed", "PackageFetcher", "find_uv"]

_LAST_LINES = 3
_OUT_OF_MEMORY = ("memory allocation of", "JavaScript heap out of memory", "Cannot allocate memory")
_LINE_CHARS = 300
JAIL_PYTHON = "/usr/bin/python3"


class FetchFailed(Exception):
    """The package could not be installed; the message is a sentence with the fix."""


@dataclass(frozen=True)
class Installed:
    command: str  # the program to run (a host path inside `directory`)
    directory: str  # the install, bound read-only into the server's jail
    fetched: bool  # installed by this call (False: it was in the cache)


def find_uv() -> str:
    """uv's path: on the system PATH, the service's PATH, or beside the service's interpreter (its venv)."""
    found = shutil.which("uv", path=SYSTEM_PATH) or shutil.which("uv")
    beside = Path(sys.executable).parent / "uv"
    if not found and beside.is_file() and os.access(beside, os.X_OK):
        found = str(beside)
    return os.path.realpath(found) if found else ""


class PackageFetcher:
    """Installs packages for the servers of one service. `jail` builds the fetch jails (the
    egress template's sizes); `template` is that template (None: the deployment has none)."""

    def __init__(self, jail: LocalJail | None, template: SandboxTemplate | None, timeout_s: float,
                 owner: tuple[int, int] | None):
        self._jail = jail
        self._template = template
        self._timeout_s = timeout_s
        self._owner = owner
        self._locks: dict[Path, asyncio.Lock] = {}

    async def ensure(self, entry: McpServerEntry, package: PackageSpec, cache: Path) -> Installed:
        """The entry's package installed under `cache` (fetched now if it is not there yet)."""
        install = cache / package.key(entry.env)
        lock = self._locks.setdefault(install, asyncio.Lock())
        async with lock:
            found = _marked(install)
            if found:
                return Installed(found, str(install), fetched=False)
            await self._fetch(entry, package, cache, install)
            return Installed(_marked(install), str(install), fetched=True)

    async def _fetch(self, entry: McpServerEntry, package: PackageSpec, cache: Path, install: Path) -> None:
        what = f"{package.runner} entry {entry.name!r}"
        if self._jail is None or not self._jail.available:
            raise FetchFailed(f"{what} could not be fetched: the local jail (bubblewrap) is not available")
        if not entry.network and self._template is None:
            raise FetchFailed(
                f"{what} could not be fetched: no sandbox template allows egress, and the server itself runs without "
                "network; add a template with `network: egress` to AGENTMESH_SANDBOX_TEMPLATES (e.g. "
                "{\"fetch\": {\"network\": \"egress\", \"memory\": \"4Gi\"}}; Helm: sandbox.templates), through which "
                "its package is fetched once, or give the entry \"network\": true")
        uv = _installer(package, what)
        binds = (uv,) if uv else ()
        _own_dir(cache, self._owner)
        partial = install.with_name(install.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        argv = fetch_command(package, f"/workspace/{partial.name}", uv, JAIL_PYTHON)
        code, stderr, failure = await self._run(cache, argv, {**fetch_env(package), **entry.env}, binds,
                                                host_network=entry.network)
        through = ("the host's network (the entry's \"network\": true)" if entry.network or self._template is None
                   else f"sandbox template {self._template.name!r} (network: egress)")
        if failure or code != 0:
            shutil.rmtree(partial, ignore_errors=True)
            said = failure or _said(stderr) or f"it ended with exit code {code}, writing nothing to stderr"
            if any(sign in stderr for sign in _OUT_OF_MEMORY):
                # uv's threads and Node's V8 reserve more address space than the default 1 GiB bound.
                said += (f"; it ran out of address space ({self._jail.limits.memory_bytes // 2**20} MiB): give the "
                         "fetch template more memory (e.g. memory: 4Gi)")
            raise FetchFailed(f"{what} could not be fetched through {through}: {said}")
        _finish(package, partial, install, what)

    async def _run(self, cache: Path, argv: tuple[str, ...], env: Mapping[str, str], binds: tuple[str, ...],
                   host_network: bool) -> tuple[int, str, str]:
        """Run the fetch jail: (exit code, stderr, why the jail itself failed or "")."""
        jail = self._jail
        assert jail is not None
        egress = not host_network
        spec = CommandSpec(session_id="mcp-fetch", call_id="", argv=argv, timeout_s=self._timeout_s,
                           network=True, egress=egress)
        info = JailInfo()
        loop = asyncio.get_running_loop()
        loop.add_reader(info.read_fd, info.on_readable)
        seccomp_fd = filter_fd(jail.seccomp) if jail.seccomp else None
        options_fd = -1
        network: UserNetwork | None = None
        attach: asyncio.Task[None] | None = None
        try:
            if egress:
                network = UserNetwork(allowed=jail.egress_allow)
            options_fd = os.memfd_create("mcp-fetch-options", os.MFD_CLOEXEC)
            command = jail.jail_argv(cache, spec, info.write_fd, seccomp_fd, extra_env=env, ro_binds=binds,
                                     options_fd=options_fd, block_fd=network.block_fd if network else None)
            command.write_options(options_fd)
            passed = tuple(fd for fd in (info.write_fd, options_fd, seccomp_fd) if fd is not None)
            if network is not None:
                passed += (network.block_fd,)
                attach = asyncio.create_task(attach_network(network, info))
            run = await run_process(command.argv, env={"PATH": SANDBOX_PATH, "LANG": "C.UTF-8"}, cwd=str(cache),
                                    timeout_s=self._timeout_s, output_cap=jail.limits.output_cap_bytes,
                                    drain_limit=jail.limits.output_drain_bytes, pass_fds=passed, killer=info.kill)
        except EgressUnavailable as exc:
            return -1, "", str(exc)
        finally:
            if options_fd >= 0:
                os.close(options_fd)
            if seccomp_fd is not None:
                os.close(seccomp_fd)
            failure = await finish_network(network, attach)
            loop.remove_reader(info.read_fd)
            info.close()
        if failure:
            return -1, "", failure
        if run.timed_out:
            return -1, "", (f"it took longer than {self._timeout_s:g} s and was stopped "
                            "(AGENTMESH_MCP_FETCH_TIMEOUT_S)")
        return run.returncode, run.stderr.text() + run.stdout.text(), ""


def _installer(package: PackageSpec, what: str) -> str:
    """uv's path for a uvx entry ("" for npx); FetchFailed when what installs it is missing."""
    if package.kind == "npm":
        if not shutil.which("npm", path=SANDBOX_PATH):
            raise FetchFailed(f"{what} could not be fetched: npx entries are installed with npm, which is not in "
                              "/usr/bin (Debian: apt-get install npm)")
        return ""
    uv = find_uv()
    if not uv:
        raise FetchFailed(f"{what} could not be fetched: uvx entries are installed with uv, which is not on the "
                          "tools service's PATH; install it (`pip install uv`, or in the tools image)")
    if not os.path.isfile(JAIL_PYTHON):
        raise FetchFailed(f"{what} could not be fetched: its virtual environment is made from {JAIL_PYTHON}, "
                          "which this host does not have (Debian: apt-get install python3)")
    return uv


def _finish(package: PackageSpec, partial: Path, install: Path, what: str) -> None:
    """Move a finished install in place, marked with its program."""
    command = installed_command(package, partial)
    if not command:
        shutil.rmtree(partial, ignore_errors=True)
        program = package.program or "the package's program"
        raise FetchFailed(f"{what} was installed, but {program} is not among its programs: name one with "
                          + ("-p PACKAGE PROGRAM" if package.runner == "npx" else "--from PACKAGE PROGRAM"))
    shutil.rmtree(install, ignore_errors=True)
    partial.rename(install)
    relative = os.path.relpath(command, partial)
    (install / FETCHED_MARK).write_text(json.dumps({"command": relative, "requirements": package.requirements}))


def _marked(install: Path) -> str:
    """The program of a finished install, "" when it is not (completely) there."""
    try:
        relative = json.loads((install / FETCHED_MARK).read_text())["command"]
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    command = install / relative
    return str(command) if isinstance(relative, str) and os.path.lexists(command) else ""


def _own_dir(path: Path, owner: tuple[int, int] | None) -> None:
    """The cache: writable by the jails' host user, nobody else's to read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.mkdir(exist_ok=True)
    if owner is not None:
        os.chown(path, *owner)
    os.chmod(path, 0o700)


def _said(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return " | ".join(line if len(line) <= _LINE_CHARS else line[:_LINE_CHARS - 1] + "…" for line in lines[-_LAST_LINES:])
