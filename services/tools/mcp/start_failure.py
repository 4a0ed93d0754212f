"""Why a stdio MCP server in the local jail ended before it answered, in one sentence with the fix.

The SDK says only "Connection closed". What the process wrote to stderr says more: bwrap's own
line when the command could not be run at all (`prlimit: failed to execute /opt/x/bin/srv: No
such file or directory`: the jail has the host's /usr and the entry's `mounts`, not /opt), or the server's
last lines (a traceback ends with its exception). The sentence names the command, what the jail
holds and the setting that would change it: the same text is the service's warning, the
McpServerStatus.error of `agentmesh mcp list` and the unavailable servers of `agentmesh tools list`.
"""

from __future__ import annotations

import os
import re

from agentmesh.tools.mcp.server_paths import SHARED

__all__ = ["LAST_LINES", "explain_exit"]

LAST_LINES = 3
_LINE_CHARS = 300
# bwrap's own exec, or the jail's last wrapper's (prlimit, setpriv) before the server.
_EXEC_FAILED = re.compile(r"^(?:bwrap: execvp|[\w-]+: failed to execute) (?P<path>.+?): (?P<reason>[^:]+)$")
_ENV_MISSING = re.compile(r"^(?:/usr)?/bin/env: ['‘]?(?P<program>[^'’:]+)['’]?: No such file or directory$")
# npm's own line when it cannot reach the registry (no network: `getaddrinfo EAI_AGAIN host`).
_REGISTRY_FAILED = re.compile(r"request to (?P<url>\S+) failed, reason: (?P<why>.+)$", re.MULTILINE)
_JAIL_PATH = ("/usr/local/bin", "/usr/bin", "/bin")


def explain_exit(command: str, lines: list[str], binds: tuple[str, ...], namespace: bool,
                 private: str = "") -> str:
    """`lines`: the non-empty lines the process wrote to stderr (the last ones count); `binds`: the
    host paths bound into its jail besides the shared system ones; `namespace`: a namespace's own
    server (no `mounts` of its own: the fix is the host's /usr or the deployment's file);
    `private`: the service's home, never bound on its own. "": it said nothing."""
    if not lines:
        return ""
    failed = _EXEC_FAILED.match(lines[-1])
    if failed is not None:
        return _not_run(command, failed.group("reason"), binds, namespace, private)
    missing = _ENV_MISSING.match(lines[-1])
    if missing is not None:
        return _env_missing(command, missing.group("program"))
    if any("JavaScript heap out of memory" in line for line in lines[-40:]):
        return ("its process ran out of memory (Node: \"JavaScript heap out of memory\"): V8 reserves more address "
                "space than the jail's bound allows; raise AGENTMESH_SANDBOX_MEMORY_BYTES (the default 1 GiB is "
                "often too small for Node servers; try 4 GiB)")
    fetch = _fetch_failure(command, lines)
    if fetch:
        return fetch
    said = " | ".join(_short(line) for line in lines[-LAST_LINES:])
    return f"its process ended: {said}"


def _not_run(command: str, reason: str, binds: tuple[str, ...], namespace: bool, private: str) -> str:
    where = ("a namespace's server sees only the host's /usr, /bin, /lib and /etc" if namespace
             else "the jail has the host's /usr, /bin, /lib and /etc and the entry's `mounts`")
    fix = ("install it under /usr/local, or have the operator add it to the deployment's servers file "
           "(AGENTMESH_MCP_SERVERS), where its directory is bound in or can be named in `mounts`" if namespace
           else f"add its directory to `mounts` (\"mounts\": [\"{_install_dir(command)}\"]) or install it under /usr/local")
    if "Permission denied" in reason:
        return (f"command {command} is not executable in the sandbox ({reason}): the jail runs it as an "
                "unprivileged user, so it and every directory above it must be readable and searchable by "
                "others (chmod o+rx)")
    if reason != "No such file or directory":
        return f"command {command} could not be run in the sandbox: {reason}"
    if private and not namespace and _visible(os.path.realpath(command), (os.path.realpath(private),)):
        return (f"command {command} not found in the sandbox: it lies in the service's home ({private}), which "
                "is never bound into a jail on its own; install it elsewhere (e.g. under /opt) or name its own "
                f"directory in `mounts` (\"mounts\": [\"{_install_dir(command)}\"])")
    if not _visible(command, binds):
        return f"command {command} not found in the sandbox: {where}; {fix}"
    interpreter = _interpreter(command)
    if interpreter is None:
        return f"command {command} could not be run in the sandbox: {reason}; {fix}"
    return (f"command {command} needs its interpreter {interpreter} (its #! line), which is not in the sandbox: "
            f"{where}; " + (fix if namespace else f"add \"{_install_dir(interpreter)}\" to `mounts`"))


def _fetch_failure(command: str, lines: list[str]) -> str:
    """npx that could not reach its package registry: the jail has no network unless the entry
    says so."""
    program = os.path.basename(command)
    if program not in ("npx", "npm"):
        return ""
    text = "\n".join(lines[-20:])
    failed = _REGISTRY_FAILED.search(text)
    if failed is None:
        return ""
    return (f"{program} could not fetch the server's package from {failed.group('url')} ({failed.group('why')}): the server's "
            "jail has no network; give the entry \"network\": true so that it can fetch (what it fetches is kept "
            "in the server's own /workspace, $AGENTMESH_HOME/mcp/<server>/), or install the server on the host "
            "and make its installed command the entry's command")


def _env_missing(command: str, program: str) -> str:
    return (f"command {command} runs `{program}` through /usr/bin/env (its #! line), and there is no {program} on "
            f"the sandbox's PATH ({':'.join(_JAIL_PATH)}): put its interpreter's absolute path in the #! line, or "
            f"make the interpreter the entry's command and the script its first argument")


def _visible(path: str, binds: tuple[str, ...]) -> bool:
    roots = (*SHARED, *binds)
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def _interpreter(command: str) -> str | None:
    """The program the script's `#!` line names; None: no such line."""
    try:
        with open(command, "rb") as file:
            head = file.read(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].split()
    if not words:
        return None
    return os.fsdecode(words[0])


def _install_dir(path: str) -> str:
    """`<prefix>` for a program in `<prefix>/bin` (a venv, /opt/tool), else its directory."""
    parent = os.path.dirname(path)
    return os.path.dirname(parent) if os.path.basename(parent) == "bin" else parent


def _short(line: str) -> str:
    return line if len(line) <= _LINE_CHARS else line[: _LINE_CHARS - 1] + "…"
