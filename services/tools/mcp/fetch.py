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
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from agentmesh.logs import get_logger
from agentmesh.tools.mcp.config import SYSTEM_PATH, McpServerEntry
from agentmesh.tools.mcp.package_cache import Pruned, prune_cache, touch
from agentmesh.tools.mcp.packages import FETCHED_MARK, PackageSpec, fetch_command, fetch_env, installed_command
from agentmesh.tools.quota import UsageMeter, WorkspaceQuota, mib
from agentmesh.tools.sandbox.base import CommandSpec
from agentmesh.tools.sandbox.egress import EgressUnavailable, UserNetwork, attach_network, finish_network
from agentmesh.tools.sandbox.jail_watch import JailInfo, JailWatch
from agentmesh.tools.sandbox.local import SANDBOX_PATH, LocalJail, jail_tmpfs
from agentmesh.tools.sandbox.process import run_process
from agentmesh.tools.sandbox.seccomp import filter_fd
from agentmesh.tools.sandbox.templates import SandboxTemplate

__all__ = ["FetchFailed", "Installed", "PackageFetcher", "find_uv"]

log = get_logger("agentmesh.tools.mcp")

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
    egress template's sizes); `template` is that template (None: the deployment has none).

    A fetch jail is bounded as a call's jail is (JailWatch, the one owner of both bounds): its
    processes together by the jail's memory, and the cache it installs into by `quota` — past
    either it is stopped, and what it wrote removed. After each install the cache is pruned to
    `ceiling` (package_cache.py), sparing what a running server uses (`ensure` holds an install
    until `release`) and what another install is making."""

    def __init__(self, jail: LocalJail | None, template: SandboxTemplate | None, timeout_s: float,
                 owner: tuple[int, int] | None, quota: WorkspaceQuota, ceiling: int):
        self._jail = jail
        self._template = template
        self._timeout_s = timeout_s
        self._owner = owner
        self._quota = quota
        self._ceiling = ceiling
        self._meter = UsageMeter(threads=1)
        self._locks: dict[Path, asyncio.Lock] = {}
        self._cache_locks: dict[Path, asyncio.Lock] = {}
        self._users: Counter[Path] = Counter()  # installs running servers use, and what installs are making

    async def ensure(self, entry: McpServerEntry, package: PackageSpec, cache: Path) -> Installed:
        """The entry's package installed under `cache` (fetched now if it is not there yet), held
        for the caller's server until `release`."""
        install = cache / package.key(entry.env)
        async with self._locks.setdefault(install, asyncio.Lock()):
            async with self._pruning(cache):  # found and held with no prune of the cache between
                found = _marked(install)
                if found:
                    self._hold(install)
            if found:
                return Installed(found, str(install), fetched=False)
            await self._fetch(entry, package, cache, install)  # held once in place
        await self.prune(cache)
        return Installed(_marked(install), str(install), fetched=True)

    def _hold(self, install: Path) -> None:
        self._users[install] += 1
        touch(install)

    def release(self, installed: Installed) -> None:
        """The server that `ensure` gave `installed` to has ended."""
        install = Path(installed.directory)
        self._users[install] -= 1
        if self._users[install] <= 0:
            del self._users[install]

    def in_use(self) -> list[Path]:
        return [path for path, users in self._users.items() if users > 0]

    async def prune(self, cache: Path) -> Pruned:
        """Prune `cache` to the ceiling, sparing what is in use."""
        async with self._pruning(cache):
            try:
                return await prune_cache(cache, self._ceiling, self.in_use())
            except OSError as exc:  # the next install's prune tries again
                log.warning("mcp package cache could not be pruned", cache=str(cache), error=str(exc))
                return Pruned((), 0)

    def _pruning(self, cache: Path) -> asyncio.Lock:
        """Held while `cache` is pruned (on a thread), and while an install in it is looked up and held."""
        return self._cache_locks.setdefault(cache, asyncio.Lock())

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
        downloads = install.with_name(install.name + ".downloads")
        making = (install, partial, downloads)
        self._users.update(making)
        try:
            for path in (partial, downloads):
                shutil.rmtree(path, ignore_errors=True)
            argv = fetch_command(package, f"/workspace/{partial.name}", f"/workspace/{downloads.name}", uv, JAIL_PYTHON)
            env = {**fetch_env(package, f"/workspace/{downloads.name}"), **entry.env}
            code, stderr, failure = await self._run(cache, argv, env, binds, host_network=entry.network)
            shutil.rmtree(downloads, ignore_errors=True)
            through = ("the host's network (the entry's \"network\": true)" if entry.network or self._template is None
                       else f"sandbox template {self._template.name!r} (network: egress)")
            if failure or code != 0:
                said = failure or _said(stderr) or f"it ended with exit code {code}, writing nothing to stderr"
                if not failure and any(sign in stderr for sign in _OUT_OF_MEMORY):
                    # uv's threads and Node's V8 reserve more address space than the default 1 GiB bound.
                    said += (f"; it ran out of address space ({self._jail.limits.memory_bytes // 2**20} MiB): give the "
                             "fetch template more memory (e.g. memory: 4Gi)")
                raise FetchFailed(f"{what} could not be fetched through {through}: {said}")
            _finish(package, partial, install, what)
            self._hold(install)  # before it stops being one in the making: no prune between
        except BaseException:
            # Failed, stopped or cancelled (the service stopping): the cache is left as it was.
            for path in (partial, downloads):
                shutil.rmtree(path, ignore_errors=True)
            raise
        finally:
            self._users.subtract(making)
            for path in making:
                if self._users[path] <= 0:
                    del self._users[path]

    async def _run(self, cache: Path, argv: tuple[str, ...], env: Mapping[str, str], binds: tuple[str, ...],
                   host_network: bool) -> tuple[int, str, str]:
        """Run the fetch jail: (exit code, stderr, why the jail itself failed or was stopped, or "")."""
        jail = self._jail
        assert jail is not None
        egress = not host_network
        spec = CommandSpec(session_id="mcp-fetch", call_id="", argv=argv, timeout_s=self._timeout_s,
                           network=True, egress=egress)
        before = await self._meter.measure(cache)
        info = JailInfo()
        guard = JailWatch(info, jail.limits.memory_bytes, jail.limits.processes, tmpfs=jail_tmpfs(jail.limits),
                          workspace=cache, quota=self._quota, disk_baseline=before.bytes, files_baseline=before.files,
                          meter=self._meter)
        loop = asyncio.get_running_loop()
        loop.add_reader(info.read_fd, info.on_readable)
        watch = asyncio.create_task(guard.run())
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
            watch.cancel()
            loop.remove_reader(info.read_fd)
            info.close()
        # Past the quota between two looks of the watch, or in its last moments, is past it too.
        after = await self._meter.measure(cache)
        stopped = guard.exceeded or ("disk_quota" if self._quota.over(after.bytes) and after.bytes > before.bytes
                                     else "")
        if stopped:
            return -1, "", self._stopped(stopped, max(after.bytes, guard.disk_usage))
        if failure:
            return -1, "", failure
        if run.timed_out:
            return -1, "", (f"it took longer than {self._timeout_s:g} s and was stopped "
                            "(AGENTMESH_MCP_FETCH_TIMEOUT_S)")
        return run.returncode, run.stderr.text() + run.stdout.text(), ""

    def _stopped(self, bound: str, usage: int) -> str:
        """The sentence for an install the watch stopped (`bound`: JailWatch.exceeded)."""
        assert self._jail is not None
        limits = self._jail.limits
        undone = "what it wrote was removed"
        if bound in ("disk_quota", "file_quota"):
            return (f"it took the package cache to {mib(usage)}, past its {mib(self._quota.limit_bytes)} quota, and was "
                    f"stopped; {undone}, the cache is as it was. If the package is that large, raise "
                    "AGENTMESH_MCP_PACKAGE_CACHE_QUOTA_MB")
        where = (f"sandbox template {self._template.name!r}'s memory (e.g. memory: 4Gi in AGENTMESH_SANDBOX_TEMPLATES)"
                 if self._template is not None else "AGENTMESH_SANDBOX_MEMORY_BYTES")
        if bound == "processes":
            return (f"it ran more than {limits.processes} processes at once and was stopped; {undone}; "
                    "raise AGENTMESH_SANDBOX_PROCESSES if the package's install needs more")
        return (f"its processes together used more than {limits.memory_bytes // 2**20} MiB of memory and were stopped; "
                f"{undone}; if the package's install needs more, raise {where}")


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
