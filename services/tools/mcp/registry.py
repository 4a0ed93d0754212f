"""Where a namespace's own MCP servers are registered: the port the tools core uses
(`Registrations`); its adapter is the memory service (memory_registrations.py), so that every
tools replica serves the same servers. What is registered is what `mcp add` was given: secret
references are names, resolved by each replica when it starts the server (secrets.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

__all__ = ["Registration", "Registrations"]


@dataclass(frozen=True)
class Registration:
    name: str
    command: str = ""
    args: tuple[str, ...] = ()
    url: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)  # literal values
    env_secrets: Mapping[str, str] = field(default_factory=dict)  # variable -> secret name
    header_secrets: Mapping[str, str] = field(default_factory=dict)  # header -> secret name
    added_at: float = 0.0

    def entry(self) -> dict[str, Any]:
        """The entry in the servers file's shape, secret references as {"secretRef": NAME}."""
        raw: dict[str, Any] = {}
        if self.command:
            raw["command"] = self.command
            raw["args"] = list(self.args)
            if self.env_secrets:
                raw["env"] = {key: {"secretRef": name} for key, name in self.env_secrets.items()}
        else:
            raw["url"] = self.url
            headers: dict[str, Any] = dict(self.headers)
            headers.update({key: {"secretRef": name} for key, name in self.header_secrets.items()})
            if headers:
                raw["headers"] = headers
        return raw

    def same_server(self, other: "Registration") -> bool:
        """The same server to run (when it was added does not matter)."""
        return (self.command, tuple(self.args), self.url, dict(self.headers), dict(self.env_secrets),
                dict(self.header_secrets)) == (other.command, tuple(other.args), other.url, dict(other.headers),
                                               dict(other.env_secrets), dict(other.header_secrets))


class Registrations(Protocol):
    async def list(self, namespace: str) -> tuple[list[Registration], float]:
        """The namespace's registrations and their version (0: none was ever made)."""

    async def put(self, namespace: str, server: Registration, *, only_if_absent: bool) -> float:
        """Store one; AlreadyExists when `only_if_absent` and the name is taken. The new version."""

    async def remove(self, namespace: str, name: str) -> float:
        """NotFound (naming the ones there are) when there is none of that name. The new version."""
