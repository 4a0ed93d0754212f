"""Gateway knobs, from AGENTMESH_GATEWAY_* (see README's configuration table)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from agentmesh.config import ConfigError, env_float, env_int, env_str
from agentmesh.gateway.routing import PeerSpec, normalize_address


@dataclass(frozen=True)
class GatewaySettings:
    max_message_chars: int = 100_000
    max_title_chars: int = 200
    max_labels: int = 32
    max_iterations_cap: int = 100
    # An upper bound on one turn, so a stuck run cannot hold a session forever.
    turn_timeout_s: float = 1800.0
    # Session routing across replicas (docs/api.md "Scaling the gateway"). No peers: this
    # replica serves every session itself, as a single gateway does.
    peers: PeerSpec = field(default_factory=PeerSpec)
    advertise_address: str = ""
    peer_refresh_s: float = 5.0
    # How long a forwarded call waits to reach the owner before this replica serves it itself.
    peer_connect_timeout_s: float = 2.0
    # HTTP/JSON + SSE API and the web console (docs/api.md); "" when turned off.
    http_address: str = "127.0.0.1:8080"
    # The largest file a client may upload into a session's workspace (the tools service has
    # its own bound, AGENTMESH_TOOLS_MAX_UPLOAD_BYTES; the smaller one holds).
    # Small by default: the gateway's gRPC receive bound grows with it (docs/security.md).
    max_upload_bytes: int = 2 * 1024 * 1024
    # The largest HTTP request body: an upload of max_upload_bytes as base64, and room.
    http_max_body_bytes: int = 4 * 1024 * 1024

    @property
    def max_request_bytes(self) -> int:
        """The largest request the gateway reads: a message of `max_message_chars` characters
        (at most 4 bytes each in UTF-8) or an upload of `max_upload_bytes`, and the rest of a
        request, with headroom; at least 1 MiB."""
        return max(1024 * 1024, 4 * self.max_message_chars + 256 * 1024, self.max_upload_bytes + 256 * 1024)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "GatewaySettings":
        peers = PeerSpec.parse(env_str(env, "AGENTMESH_GATEWAY_PEERS"))
        advertise = env_str(env, "AGENTMESH_GATEWAY_ADVERTISE_ADDR")
        if peers.enabled and not advertise:
            raise ConfigError(
                "AGENTMESH_GATEWAY_ADVERTISE_ADDR must be set when AGENTMESH_GATEWAY_PEERS is: "
                "the host:port the other replicas reach this one at (in a pod: $(POD_IP):50051)"
            )
        if advertise:
            try:
                advertise = normalize_address(advertise)
            except ValueError as exc:
                raise ConfigError(f"AGENTMESH_GATEWAY_ADVERTISE_ADDR: {exc}") from None
        max_upload = env_int(env, "AGENTMESH_GATEWAY_MAX_UPLOAD_BYTES", cls.max_upload_bytes, minimum=1024)
        if max_upload > 12 * 1024 * 1024:
            raise ConfigError(
                f"AGENTMESH_GATEWAY_MAX_UPLOAD_BYTES must be at most 12582912 (12 MiB), got {max_upload}: "
                "an upload travels to the tools service as one gRPC message"
            )
        return cls(
            http_address=_http_address(env),
            max_upload_bytes=max_upload,
            # Base64 is 4/3 of the bytes; the JSON around it and a chat message fit in the rest.
            http_max_body_bytes=env_int(env, "AGENTMESH_GATEWAY_HTTP_MAX_BODY_BYTES",
                                        max(cls.http_max_body_bytes, max_upload * 4 // 3 + 1024 * 1024), minimum=1024),
            max_message_chars=env_int(env, "AGENTMESH_GATEWAY_MAX_MESSAGE_CHARS", cls.max_message_chars, minimum=1),
            max_iterations_cap=env_int(env, "AGENTMESH_GATEWAY_MAX_ITERATIONS_CAP", cls.max_iterations_cap, minimum=1),
            turn_timeout_s=env_float(env, "AGENTMESH_GATEWAY_TURN_TIMEOUT_S", cls.turn_timeout_s, minimum=1),
            peers=peers,
            advertise_address=advertise,
            peer_refresh_s=env_float(env, "AGENTMESH_GATEWAY_PEER_REFRESH_S", cls.peer_refresh_s, minimum=0.1),
            peer_connect_timeout_s=env_float(
                env, "AGENTMESH_GATEWAY_PEER_CONNECT_TIMEOUT_S", cls.peer_connect_timeout_s, minimum=0.05
            ),
        )


def _http_address(env: Mapping[str, str]) -> str:
    """AGENTMESH_GATEWAY_HTTP_ADDR: unset means the default; empty or "off" turns HTTP off;
    port 0 takes a free port (tests)."""
    raw = env.get("AGENTMESH_GATEWAY_HTTP_ADDR")
    if raw is None:
        return GatewaySettings.http_address
    raw = raw.strip()
    if raw.lower() in ("", "off"):
        return ""
    host, sep, port = raw.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"AGENTMESH_GATEWAY_HTTP_ADDR must be host:port (or 'off'), got {raw!r}")
    return raw
