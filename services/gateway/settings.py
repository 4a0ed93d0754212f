"""Gateway knobs, from AGENTMESH_GATEWAY_* (see README's configuration table)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from agentmesh.config import env_float, env_int


@dataclass(frozen=True)
class GatewaySettings:
    max_message_chars: int = 100_000
    max_title_chars: int = 200
    max_labels: int = 32
    max_iterations_cap: int = 100
    # An upper bound on one turn, so a stuck run cannot hold a session forever.
    turn_timeout_s: float = 1800.0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "GatewaySettings":
        return cls(
            max_message_chars=env_int(env, "AGENTMESH_GATEWAY_MAX_MESSAGE_CHARS", cls.max_message_chars, minimum=1),
            max_iterations_cap=env_int(env, "AGENTMESH_GATEWAY_MAX_ITERATIONS_CAP", cls.max_iterations_cap, minimum=1),
            turn_timeout_s=env_float(env, "AGENTMESH_GATEWAY_TURN_TIMEOUT_S", cls.turn_timeout_s, minimum=1),
        )
