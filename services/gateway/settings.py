"""Gateway knobs, from AGENTMESH_GATEWAY_* (see README's configuration table)."""

from __future__ import annotations

from dataclasses import dataclass

from agentmesh.config import ConfigError, EnvSection, env
from agentmesh.gateway.routing import PeerSpec, normalize_address

__all__ = ["GatewaySettings"]


@dataclass(frozen=True)
class GatewaySettings(EnvSection):
    max_message_chars: int = env("AGENTMESH_GATEWAY_MAX_MESSAGE_CHARS", 100_000, minimum=1)
    max_title_chars: int = 200
    max_labels: int = 32
    max_iterations_cap: int = env("AGENTMESH_GATEWAY_MAX_ITERATIONS_CAP", 100, minimum=1)
    # An upper bound on one turn, so a stuck run cannot hold a session forever.
    turn_timeout_s: float = env("AGENTMESH_GATEWAY_TURN_TIMEOUT_S", 1800.0, minimum=1)
    # Session routing across replicas (docs/api.md "Scaling the gateway"). No peers: this
    # replica serves every session itself, as a single gateway does.
    peers: PeerSpec = env("AGENTMESH_GATEWAY_PEERS", default_factory=PeerSpec, parse=PeerSpec.parse)
    advertise_address: str = env("AGENTMESH_GATEWAY_ADVERTISE_ADDR", "")
    peer_refresh_s: float = env("AGENTMESH_GATEWAY_PEER_REFRESH_S", 5.0, minimum=0.1)
    # How long a forwarded call waits to reach the owner before this replica serves it itself.
    peer_connect_timeout_s: float = env("AGENTMESH_GATEWAY_PEER_CONNECT_TIMEOUT_S", 2.0, minimum=0.05)

    @property
    def max_request_bytes(self) -> int:
        """The largest request the gateway reads: a message of `max_message_chars` characters
        (at most 4 bytes each in UTF-8) and the rest of a request, with headroom; at least 1 MiB."""
        return max(1024 * 1024, 4 * self.max_message_chars + 256 * 1024)

    def __post_init__(self) -> None:
        if self.peers.enabled and not self.advertise_address:
            raise ConfigError(
                "AGENTMESH_GATEWAY_ADVERTISE_ADDR must be set when AGENTMESH_GATEWAY_PEERS is: "
                "the host:port the other replicas reach this one at (in a pod: $(POD_IP):50051)"
            )
        if self.advertise_address:
            try:
                object.__setattr__(self, "advertise_address", normalize_address(self.advertise_address))
            except ValueError as exc:
                raise ConfigError(f"AGENTMESH_GATEWAY_ADVERTISE_ADDR: {exc}") from None
