"""Secret references of MCP server entries: `{"secretRef": "NAME"}` in place of a literal value of
`env` or `headers`, resolved by the tools service when it starts the server and nowhere else.

Secrets are files the operator mounts under AGENTMESH_MCP_SECRETS_DIR — a Kubernetes Secret
mounted as a volume is exactly that, one file per key (read each time a server is started, so a
rotated Secret is used from the next start on):

- the deployment's entries (AGENTMESH_MCP_SERVERS) read `<dir>/NAME`, or, when there is no such
  file, the variable `AGENTMESH_MCP_SECRET_NAME` of the service's environment;
- a namespace's own entries (`agentmesh mcp add --env-secret KEY=NAME`) read `<dir>/<namespace>/NAME`
  only: a namespace can use the secrets the operator gave it, never the deployment's or another
  namespace's (its server could send them anywhere it likes).

What is stored (the memory service's registrations, the deployment file) is the name; what a
jailed server sees is the value of the variables of its own entry, never the directory.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Mapping

from agentmesh.config import ConfigError

SECRET_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")  # an HTTP token
SECRET_ENV_PREFIX = "AGENTMESH_MCP_SECRET_"
MAX_SECRET_BYTES = 64 * 1024


class UnknownSecret(ConfigError):
    """A reference names a secret that is not there; the message says where it was looked for."""


def is_reference(value: Any) -> bool:
    return isinstance(value, dict) and "secretRef" in value


class SecretSource:
    """The secrets an entry may refer to: the deployment's (namespace None) or one namespace's."""

    def __init__(self, directory: str = "", environ: Mapping[str, str] | None = None, namespace: str | None = None):
        self.directory = directory
        # The AGENTMESH_MCP_SECRET_* variables: `${...}` references in literal values (any entry's)
        # and, for the deployment's entries only, the fallback of a secretRef.
        self.environ: Mapping[str, str] = environ or {}
        self.namespace = namespace

    def for_namespace(self, namespace: str) -> "SecretSource":
        return SecretSource(self.directory, self.environ, namespace)

    def _where(self, name: str) -> Path | None:
        if not self.directory:
            return None
        if self.namespace is None:
            return Path(self.directory) / name
        if self.namespace in (".", ".."):  # valid namespaces, but not directories of their own
            return None
        return Path(self.directory) / self.namespace / name

    def resolve(self, name: str, what: str) -> str:
        """The value of secret `name`, for `what` ("MCP server 'docs': env.API_KEY")."""
        if not isinstance(name, str) or not SECRET_NAME.match(name):
            raise ConfigError(f"{what} names secret {name!r}; a secret name is 1-63 letters, digits, '_', '.' "
                              "or '-', not starting with '.' or '-'")
        path = self._where(name)
        if path is not None and path.is_file():
            root = os.path.realpath(self.directory)
            # A mounted Secret's files are symlinks into the same directory (..data/); none may lead out.
            if not os.path.realpath(path).startswith(root + os.sep):
                raise ConfigError(f"{what}: secret {name!r} leads outside AGENTMESH_MCP_SECRETS_DIR")
            data = path.read_bytes()[:MAX_SECRET_BYTES + 1]
            if len(data) > MAX_SECRET_BYTES:
                raise ConfigError(f"{what}: secret {name!r} is over {MAX_SECRET_BYTES} bytes")
            # Files written by hand usually end in a newline the value does not have.
            return data.decode("utf-8", errors="replace").removesuffix("\n").removesuffix("\r")
        variable = SECRET_ENV_PREFIX + name
        if self.namespace is None and variable in self.environ:
            return self.environ[variable]
        raise UnknownSecret(f"{what} refers to secret {name!r}, which {self._missing_where(name)}")

    def _missing_where(self, name: str) -> str:
        if self.namespace is None:
            looked = f"there is no file {Path(self.directory) / name}" if self.directory else \
                "no AGENTMESH_MCP_SECRETS_DIR is mounted"
            return f"is not set: {looked}, and {SECRET_ENV_PREFIX}{name} is not in the tools service's environment"
        if not self.directory:
            return (f"namespace {self.namespace!r} does not have: no secrets are mounted for namespaces "
                    "(AGENTMESH_MCP_SECRETS_DIR is not set)")
        where = self._where(name)
        return f"namespace {self.namespace!r} does not have" + (f" (there is no file {where})" if where else "")


def resolve_values(server: str, key: str, values: Mapping[str, Any], source: SecretSource) -> dict[str, Any]:
    """`values` with each `{"secretRef": NAME}` (for headers optionally with a "prefix", e.g.
    "Bearer ") replaced by the secret; literal strings are left for the caller."""
    resolved: dict[str, Any] = {}
    for item, value in values.items():
        if not is_reference(value):
            resolved[item] = value
            continue
        unknown = sorted(set(value) - {"secretRef", "prefix"})
        if unknown or not isinstance(value.get("prefix", ""), str):
            raise ConfigError(f"MCP server {server!r}: {key}.{item} must be a string or "
                              '{"secretRef": NAME} (with an optional string "prefix")')
        names = ENV_NAME if key == "env" else HEADER_NAME
        if not names.match(item):
            raise ConfigError(f"MCP server {server!r}: {item!r} is not a valid {'variable' if key == 'env' else 'header'} name")
        resolved[item] = value.get("prefix", "") + source.resolve(value["secretRef"], f"MCP server {server!r}: {key}.{item}")
    return resolved
