"""`npx -y PKG` and `uvx PKG` entries: which package they fetch, how it is installed, what runs.

Claude Desktop's usual entries name a package runner, not a program: npx and uvx download the
package at every first start and run its program. In the jail that download would need the
network for the server's whole life. Instead the package is installed ONCE, by a one-shot jail
with network (fetch.py), into a directory of its own under the servers' package cache; the
server then runs that installed program, offline, with the directory bound read-only. Both
installs are relocatable (npm's node_modules links are relative; `uv venv --relocatable` writes
scripts that find their interpreter beside themselves), so the directory installed at the fetch
jail's /workspace runs from its host path.

    npx -y @modelcontextprotocol/server-everything   -> npm install --prefix DIR PKG; DIR/node_modules/.bin/BIN
    npx -y -p PKG BIN ARGS                           -> the same, running BIN
    uvx mcp-server-time ARGS                          -> uv venv DIR; uv pip install PKG; DIR/bin/mcp-server-time
    uvx --from 'PKG[extra]==1.2' CMD --with X ARGS    -> the same with those requirements, running CMD
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from agentmesh.config import ConfigError

__all__ = ["FETCHED_MARK", "PackageSpec", "fetch_command", "fetch_env", "installed_command", "package_runner"]

# Written into an install directory once its package is in place: the program to run.
FETCHED_MARK = ".agentmesh-fetched.json"
_NPX_FLAGS = {"-y", "--yes", "-q", "--quiet", "--silent"}
_UVX_FLAGS = {"-q", "--quiet", "--isolated", "--no-progress", "--offline"}
# A requirement's name: PEP 508's start (extras and version follow).
_PY_NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)")
# Variables of the entry's env that change what is fetched (a mirror, an index): part of the cache key.
_SOURCE_ENV = re.compile(r"^(npm_config_registry|npm_config_@.*:registry|UV_INDEX.*|UV_DEFAULT_INDEX|UV_EXTRA_INDEX_URL|"
                         r"UV_FIND_LINKS|PIP_INDEX_URL|PIP_EXTRA_INDEX_URL)$")


@dataclass(frozen=True)
class PackageSpec:
    """What an npx or uvx entry installs and runs."""

    runner: str  # "npx" | "uvx"
    requirements: tuple[str, ...]  # what is installed: npm package specs, or PEP 508 requirements
    program: str  # the program it runs ("" for npx without -p: the package's own bin)
    args: tuple[str, ...]  # the server's own arguments

    @property
    def kind(self) -> str:
        return "npm" if self.runner == "npx" else "uv"

    def key(self, env: Mapping[str, str]) -> str:
        """The install directory's name: the same requirements from the same source share it."""
        source = sorted((k, v) for k, v in env.items() if _SOURCE_ENV.match(k))
        digest = hashlib.sha256(json.dumps([self.runner, self.requirements, self.program, source]).encode())
        return f"{self.kind}-{digest.hexdigest()[:20]}"


def package_runner(name: str, command: str, args: tuple[str, ...]) -> PackageSpec | None:
    """The package an `npx` or `uvx` entry runs; None for any other command. ConfigError for a
    runner's option this does not know (it would change what is fetched or how it runs)."""
    program = os.path.basename(command)
    if program == "npx":
        return _npx(name, args)
    if program == "uvx":
        return _uvx(name, args)
    return None


def _option_value(name: str, runner: str, args: tuple[str, ...], i: int) -> tuple[str, int]:
    option, _, value = args[i].partition("=")
    if value:
        return value, i + 1
    if i + 1 >= len(args):
        raise ConfigError(f"MCP server {name!r}: {runner} option {option} needs a value")
    return args[i + 1], i + 2


def _npx(name: str, args: tuple[str, ...]) -> PackageSpec:
    packages: list[str] = []
    i = 0
    while i < len(args) and args[i].startswith("-"):
        if args[i] in _NPX_FLAGS:
            i += 1
        elif args[i].split("=", 1)[0] in ("-p", "--package"):
            value, i = _option_value(name, "npx", args, i)
            packages.append(value)
        else:
            raise ConfigError(f"MCP server {name!r}: npx option {args[i]!r} is not understood here (the package is "
                              "installed once and its program run offline: -y, -p/--package and the package are)")
    if i >= len(args):
        raise ConfigError(f"MCP server {name!r}: npx names no package (\"args\": [\"-y\", \"PACKAGE\", ...])")
    if packages:
        return PackageSpec("npx", tuple(packages), args[i], args[i + 1:])
    return PackageSpec("npx", (args[i],), "", args[i + 1:])


def _uvx(name: str, args: tuple[str, ...]) -> PackageSpec:
    source = ""
    extra: list[str] = []
    i = 0
    while i < len(args) and args[i].startswith("-"):
        if args[i] in _UVX_FLAGS:
            i += 1
        elif args[i].split("=", 1)[0] == "--from":
            source, i = _option_value(name, "uvx", args, i)
        elif args[i].split("=", 1)[0] == "--with":
            value, i = _option_value(name, "uvx", args, i)
            extra.append(value)
        else:
            raise ConfigError(f"MCP server {name!r}: uvx option {args[i]!r} is not understood here (the package is "
                              "installed once and its program run offline: --from, --with and the command are)")
    if i >= len(args):
        raise ConfigError(f"MCP server {name!r}: uvx names no command (\"args\": [\"PACKAGE\", ...])")
    command = args[i]
    if source:
        return PackageSpec("uvx", (source, *extra), command, args[i + 1:])
    # `uvx pkg@1.2` is pkg==1.2, `pkg@latest` the newest; the program is the package's name.
    requirement, _, version = command.partition("@")
    found = _PY_NAME.match(requirement)
    if found is None:
        raise ConfigError(f"MCP server {name!r}: uvx command {command!r} is not a package name")
    if version and version != "latest":
        requirement = f"{requirement}=={version}"
    return PackageSpec("uvx", (requirement, *extra), found.group(1), args[i + 1:])


def fetch_command(package: PackageSpec, target: str, downloads: str, uv: str, python: str) -> tuple[str, ...]:
    """The fetch jail's program: install `package` into `target` (a path inside that jail, under
    its /workspace, which is the package cache), downloading into `downloads` (the install's own
    download cache beside it, removed once the install is done: package_cache.py)."""
    if package.kind == "npm":
        return ("npm", "install", "--prefix", target, "--cache", downloads, "--no-audit", "--no-fund",
                "--no-update-notifier", "--loglevel=error", "--", *package.requirements)
    script = ('uv="$1"; target="$2"; python="$3"; shift 3; '
              '"$uv" venv --quiet --relocatable --python "$python" "$target" && '
              '"$uv" pip install --quiet --python "$target/bin/python" -- "$@"')
    return ("/bin/sh", "-c", script, "uv-fetch", uv, target, python, *package.requirements)


def fetch_env(package: PackageSpec, downloads: str) -> dict[str, str]:
    """The fetch jail's environment besides the entry's own."""
    if package.kind == "npm":
        return {"npm_config_update_notifier": "false", "npm_config_fund": "false"}
    # Compiled now: the server reads its install read-only, so Python could not cache bytecode later.
    return {"UV_CACHE_DIR": downloads, "UV_PYTHON_DOWNLOADS": "never", "UV_NO_PROGRESS": "1",
            "UV_COMPILE_BYTECODE": "1"}


def installed_command(package: PackageSpec, install: Path) -> str:
    """The program to run in a finished install (a host path); "" when it has none."""
    if package.kind == "uv":
        program = install / "bin" / package.program
        return str(program) if program.is_file() else ""
    bin_dir = install / "node_modules" / ".bin"
    if package.program:
        return str(bin_dir / package.program) if (bin_dir / package.program).exists() else ""
    name = _npm_installed_name(install)
    if not name:
        return ""
    try:
        manifest = json.loads((install / "node_modules" / name / "package.json").read_text())
    except (OSError, ValueError):
        return ""
    bins = manifest.get("bin")
    if isinstance(bins, str):
        bins = {name.rsplit("/", 1)[-1]: bins}
    if not isinstance(bins, dict) or not bins:
        return ""
    # npx's own choice: the only program, else the one named as the package (without its scope).
    chosen = next(iter(bins)) if len(bins) == 1 else name.rsplit("/", 1)[-1]
    return str(bin_dir / chosen) if (bin_dir / chosen).exists() else ""


def _npm_installed_name(install: Path) -> str:
    """The package `npm install --prefix` added (its package.json's one dependency)."""
    try:
        dependencies = json.loads((install / "package.json").read_text()).get("dependencies", {})
    except (OSError, ValueError, AttributeError):
        return ""
    return next(iter(dependencies), "") if isinstance(dependencies, dict) and len(dependencies) == 1 else ""
