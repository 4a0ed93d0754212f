"""The `mcpServers` file (AGENTMESH_MCP_SERVERS): the JSON shape MCP clients already share.

    {"mcpServers": {
        "time":  {"command": "mcp-server-time", "args": ["--local-timezone", "UTC"]},
        "notes": {"url": "https://notes.example.com/mcp", "headers": {"Authorization": "Bearer ..."}}
    }}

Beyond the shared shape a stdio entry may say `"network": true` (its jail or pod gets the network),
`"mounts": ["/opt/mcp"]` (host directories bound read-only into its jail, e.g. where the server is
installed when that is not under /usr; local jail only) and `"image": "ghcr.io/..."` (the image
its pod runs; AGENTMESH_SANDBOX=kubernetes only, where the command is the image's, not the host's).
An `npx -y PKG` or `uvx PKG` entry names a package rather than a program: in the local jail the
package is installed once through a sandbox with network and its program run offline (packages.py).
A value of `env` or `headers` may be a secret reference
instead of a literal: `{"secretRef": "NAME"}` (headers: with an optional `"prefix": "Bearer "`),
a file of AGENTMESH_MCP_SECRETS_DIR or the variable AGENTMESH_MCP_SECRET_NAME (secrets.py); and
`${AGENTMESH_MCP_SECRET_X}` inside a literal is replaced by that variable. Either way the file
itself can be a ConfigMap while the secrets stay in a Secret, and only that family of variables
can be referred to: an entry cannot pull the service's own credentials.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlparse

from agentmesh.config import ConfigError
from agentmesh.tools.mcp.packages import PackageSpec, package_runner
from agentmesh.tools.mcp.secrets import SecretSource, is_reference, resolve_values

# Model APIs allow [A-Za-z0-9_-] in tool names; the server name is the prefix of each of its tools.
SERVER_NAME = re.compile(r"^[A-Za-z0-9-]{1,32}$")
SECRET_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
SECRET_PREFIX = "AGENTMESH_MCP_SECRET_"
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
# An image reference as Kubernetes takes it (registry/path:tag@digest); the kubelet judges the rest.
IMAGE_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}$")


@dataclass(frozen=True)
class McpServerEntry:
    name: str
    # stdio: the program (an absolute path, or found on the system PATH) and its arguments.
    command: str = ""
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    network: bool = False
    mounts: tuple[str, ...] = ()
    # AGENTMESH_SANDBOX=kubernetes: the pod's image ("" = AGENTMESH_SANDBOX_IMAGE).
    image: str = ""
    # An `npx`/`uvx` entry in the local jail: the package installed once and run offline (packages.py).
    package: PackageSpec | None = None
    # streamable HTTP
    url: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def transport(self) -> str:
        return "stdio" if self.command else "http"


def _strings(name: str, key: str, value: Any, kind: type) -> Any:
    if kind is list:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"MCP server {name!r}: {key!r} must be a list of strings")
        return tuple(value)
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ConfigError(f"MCP server {name!r}: {key!r} must be an object of string values")
    return value


def _values(name: str, key: str, value: Any, environ: Mapping[str, str] | SecretSource,
            kind: str = "MCP server") -> dict[str, str]:
    """An `env` or `headers` object: literals (with their ${AGENTMESH_MCP_SECRET_X} references
    replaced) and {"secretRef": NAME} values, resolved."""
    if not isinstance(value, dict) or not all(isinstance(k, str) and (isinstance(v, str) or is_reference(v))
                                              for k, v in value.items()):
        raise ConfigError(f"{kind} {name!r}: {key!r} must be an object of string values or "
                          '{"secretRef": NAME} references')
    source = environ if isinstance(environ, SecretSource) else SecretSource("", environ)
    literals = {k: v for k, v in value.items() if isinstance(v, str)}
    if source.namespace is not None:
        # The deployment's variables are the operator's: a namespace's server, whose URL its
        # admin chooses, could send them anywhere. A namespace has only its own secrets.
        for item, literal in literals.items():
            if found := SECRET_REF.search(literal):
                raise ConfigError(
                    f"{kind} {name!r}: {key}.{item} refers to ${{{found.group(1)}}}, a variable of the tools service's environment, "
                    f"which a namespace's servers may not use; put the value in a secret of namespace "
                    f"{source.namespace!r} and refer to it ({'--env-secret' if key == 'env' else '--header-secret'})")
    literals = _resolve_secrets(name, key, literals, source.environ, kind)
    references = resolve_values(name, key, {k: v for k, v in value.items() if is_reference(v)}, source)
    return {item: literals[item] if item in literals else references[item] for item in value}


def _resolve_secrets(name: str, key: str, values: Mapping[str, str], secrets: Mapping[str, str],
                     kind: str = "MCP server") -> dict[str, str]:
    """Each `${AGENTMESH_MCP_SECRET_X}` in a value replaced by that variable of the service's environment."""
    def substitute(match: re.Match[str], item: str) -> str:
        variable = match.group(1)
        if not variable.startswith(SECRET_PREFIX):
            raise ConfigError(f"{kind} {name!r}: {key}.{item} refers to ${{{variable}}}; secret references "
                              f"must name a variable starting with {SECRET_PREFIX}")
        if variable not in secrets:
            raise ConfigError(f"{kind} {name!r}: {key}.{item} refers to ${{{variable}}}, which is not set "
                              "in the tools service's environment")
        return secrets[variable]

    resolved = {}
    for item, value in values.items():
        resolved[item] = SECRET_REF.sub(functools.partial(substitute, item=item), value)
    return resolved


def resolve_command(name: str, command: str, service_path: bool = False) -> str:
    """The program's absolute path; ConfigError when it does not exist (checked on the host, whose
    /usr the jail shares). With `service_path` (the deployment's own servers, whose install the
    jail binds in: server_paths.py) a name not on the system PATH is looked for on the service's
    PATH too — a pipx or venv install's bin directory."""
    found = command if os.path.isabs(command) else shutil.which(command, path=SYSTEM_PATH)
    searched = SYSTEM_PATH
    if not found and service_path and not os.path.isabs(command):
        searched = f"{SYSTEM_PATH} or the tools service's PATH"
        found = shutil.which(command)
    if not found or not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise ConfigError(
            f"MCP server {name!r}: command {command!r} was not found"
            + ("" if os.path.isabs(command) else f" on {searched} (give an absolute path for programs elsewhere)")
        )
    return found


def parse_entry(name: str, raw: Any, environ: Mapping[str, str] | SecretSource, sandbox: str = "local") -> McpServerEntry:
    """An entry checked, its secret references resolved from `environ` (the AGENTMESH_MCP_SECRET_*
    variables) or a SecretSource (those and the mounted secret files, for the deployment or one
    namespace), for where stdio servers run: `sandbox` "local" (the jail: the command must exist on
    the host) or "kubernetes" (a pod: the command is the image's, found there)."""
    if not SERVER_NAME.match(name):
        raise ConfigError(f"MCP server name {name!r} must be 1-32 letters, digits or '-' (it prefixes tool names)")
    if not isinstance(raw, dict):
        raise ConfigError(f"MCP server {name!r} must be an object with either 'command' or 'url'")
    known = {"command", "args", "env", "network", "mounts", "image", "url", "headers", "type", "transport"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"MCP server {name!r}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    if bool(raw.get("command")) == bool(raw.get("url")):
        raise ConfigError(f"MCP server {name!r} needs exactly one of 'command' (stdio) or 'url' (streamable HTTP)")
    if raw.get("url"):
        url = raw["url"]
        parsed = urlparse(url) if isinstance(url, str) else None
        if parsed is None or parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ConfigError(f"MCP server {name!r}: url {url!r} is not an http(s) URL")
        return McpServerEntry(name=name, url=url, headers=_values(name, "headers", raw.get("headers", {}), environ))
    command = raw["command"]
    if not isinstance(command, str):
        raise ConfigError(f"MCP server {name!r}: 'command' must be a string")
    network = raw.get("network", False)
    if not isinstance(network, bool):
        raise ConfigError(f"MCP server {name!r}: 'network' must be true or false")
    mounts = _strings(name, "mounts", raw.get("mounts", []), list)
    image = raw.get("image", "")
    if not isinstance(image, str) or (image and not IMAGE_REF.match(image)):
        raise ConfigError(f"MCP server {name!r}: image {image!r} is not an image reference (e.g. ghcr.io/org/server:1.2)")
    if sandbox == "kubernetes":
        if mounts:
            raise ConfigError(f"MCP server {name!r}: 'mounts' binds host directories into the local jail; with "
                              "AGENTMESH_SANDBOX=kubernetes the server runs in a pod and finds its files in its image ('image')")
        if not command.strip():
            raise ConfigError(f"MCP server {name!r}: 'command' is empty")
    else:
        if image:
            raise ConfigError(f"MCP server {name!r}: 'image' is for AGENTMESH_SANDBOX=kubernetes (the server as a pod); "
                              "in the local jail it runs from the host's /usr and its 'mounts'")
        for mount in mounts:
            if not os.path.isabs(mount) or not os.path.exists(mount):
                raise ConfigError(f"MCP server {name!r}: mount {mount!r} is not an existing absolute path")
    args = _strings(name, "args", raw.get("args", []), list)
    # A package runner's package is installed by the service (fetch.py): the runner itself never runs.
    package = package_runner(name, command, args) if sandbox == "local" else None
    return McpServerEntry(
        name=name,
        # In a pod the container runtime finds the command on the image's PATH; nothing to check here.
        command=command if sandbox == "kubernetes" or package is not None
        else resolve_command(name, command, service_path=not _of_namespace(environ)),
        args=args,
        env=_values(name, "env", raw.get("env", {}), environ),
        network=network,
        mounts=mounts,
        image=image,
        package=package,
    )


def _of_namespace(environ: Mapping[str, str] | SecretSource) -> bool:
    """Whether the entry is a namespace's own (its admin's), not the deployment's (the operator's)."""
    return isinstance(environ, SecretSource) and environ.namespace is not None


@dataclass(frozen=True)
class A2aAgentEntry:
    """A remote A2A agent (another agentmesh, or any A2A server) offered to the model as a tool."""

    name: str
    url: str  # its base URL: the agent card is at <url>/.well-known/agent-card.json
    headers: Mapping[str, str] = field(default_factory=dict)


def parse_a2a_entry(name: str, raw: Any, environ: Mapping[str, str] | SecretSource) -> A2aAgentEntry:
    if not SERVER_NAME.match(name):
        raise ConfigError(f"A2A agent name {name!r} must be 1-32 letters, digits or '-' (it names the tool a2a__{name})")
    if not isinstance(raw, dict):
        raise ConfigError(f"A2A agent {name!r} must be an object with 'url' (and optional 'headers')")
    unknown = sorted(set(raw) - {"url", "headers"})
    if unknown:
        raise ConfigError(f"A2A agent {name!r}: unknown key(s) {', '.join(unknown)}; known: headers, url")
    url = raw.get("url")
    parsed = urlparse(url) if isinstance(url, str) else None
    if not isinstance(url, str) or parsed is None or parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError(f"A2A agent {name!r}: url {url!r} is not an http(s) URL")
    headers = _values(name, "headers", raw.get("headers", {}), environ, kind="A2A agent")
    return A2aAgentEntry(name=name, url=url.rstrip("/"), headers=headers)


def parse_servers(document: Any, environ: Mapping[str, str] | SecretSource, source: str = "the MCP server list",
                  sandbox: str = "local") -> list[McpServerEntry]:
    if not isinstance(document, dict) or not isinstance(document.get("mcpServers", {}), dict) or \
            not ("mcpServers" in document or "a2aAgents" in document):
        raise ConfigError(f'{source} must be a JSON object {{"mcpServers": {{NAME: {{...}}}}}} '
                          '(and/or "a2aAgents": {NAME: {"url": ...}})')
    return [parse_entry(name, raw, environ, sandbox) for name, raw in document.get("mcpServers", {}).items()]


def parse_agents(document: Any, environ: Mapping[str, str] | SecretSource, source: str = "the MCP server list") -> list[A2aAgentEntry]:
    agents = document.get("a2aAgents", {}) if isinstance(document, dict) else {}
    if not isinstance(agents, dict):
        raise ConfigError(f'{source}: "a2aAgents" must be an object {{NAME: {{"url": ..., "headers": ...}}}}')
    return [parse_a2a_entry(name, raw, environ) for name, raw in agents.items()]


def load_servers(path: str, environ: Mapping[str, str] | SecretSource, sandbox: str = "local") -> list[McpServerEntry]:
    """Read and check AGENTMESH_MCP_SERVERS; every problem is a ConfigError naming the file."""
    if not path:
        return []
    return parse_servers(_read(path), environ, source=f"AGENTMESH_MCP_SERVERS={path}", sandbox=sandbox)


def load_agents(path: str, environ: Mapping[str, str] | SecretSource, sandbox: str = "local") -> list[A2aAgentEntry]:
    """The remote A2A agents of the same file ("a2aAgents")."""
    if not path:
        return []
    source = f"AGENTMESH_MCP_SERVERS={path}"
    document = _read(path)
    parse_servers(document, environ, source=source, sandbox=sandbox)  # the same shape checks as for the servers
    return parse_agents(document, environ, source=source)


def _read(path: str) -> Any:
    try:
        document = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"AGENTMESH_MCP_SERVERS={path}: cannot read it ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"AGENTMESH_MCP_SERVERS={path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    return document
