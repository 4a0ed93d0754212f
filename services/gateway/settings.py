"""Gateway knobs, from AGENTMESH_GATEWAY_* (see README's configuration table)."""

from __future__ import annotations

from dataclasses import dataclass

from agentmesh.config import ConfigError, EnvSection, env
from agentmesh.errors import InvalidArgument
from agentmesh.gateway.routing import PeerSpec, normalize_address
from agentmesh.toolpolicy import PERMISSION_MODES, validate_policy
from agentmesh.turn_input import IF_BUSY_POLICIES

__all__ = ["GatewaySettings"]

DEFAULT_AGENT_DESCRIPTION = (
    "An agentmesh agent: it plans, runs tools in a sandbox (shell, Python, files, the web) and "
    "remembers across conversations. Send it a task in plain words."
)


def _public_url(raw: str) -> str:
    raw = raw.strip().rstrip("/")
    if not raw.startswith(("http://", "https://")):
        raise ValueError(f"must be an http(s) URL, got {raw!r}")
    return raw


def _tool_entries(raw: str) -> tuple[str, ...]:
    """`"shell, python,,github__*"` -> ("shell", "python", "github__*"), each entry well-formed."""
    entries = tuple(dict.fromkeys(name.strip() for name in raw.split(",") if name.strip()))
    try:
        validate_policy(entries, (), "the list")
    except InvalidArgument as exc:
        raise ValueError(exc.message) from None
    return entries


def _http_address(raw: str) -> str:
    """AGENTMESH_GATEWAY_HTTP_ADDR: host:port, or "off" (HTTP turned off: "")."""
    raw = raw.strip()
    if raw.lower() == "off":
        return ""
    host, sep, port = raw.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"must be host:port (or 'off'), got {raw!r}")
    return raw


@dataclass(frozen=True)
class GatewaySettings(EnvSection):
    max_message_chars: int = env("AGENTMESH_GATEWAY_MAX_MESSAGE_CHARS", 100_000, minimum=1)
    max_title_chars: int = 200
    max_labels: int = 32
    max_iterations_cap: int = env("AGENTMESH_GATEWAY_MAX_ITERATIONS_CAP", 100, minimum=1)
    # An upper bound on one turn, so a stuck run cannot hold a session forever.
    turn_timeout_s: float = env("AGENTMESH_GATEWAY_TURN_TIMEOUT_S", 1800.0, minimum=1)
    # A run's record is refreshed by the replica relaying it a few times within this lease; one
    # that has not been for longer lost its gateway (killed, its node gone) and is recorded
    # `interrupted` by the replica that reads it (runs.py).
    run_lease_s: float = env("AGENTMESH_GATEWAY_RUN_LEASE_S", 30.0, minimum=0.5)
    # What a message to a session that runs a turn does when its ChatOptions.if_busy is empty.
    if_busy: str = env("AGENTMESH_GATEWAY_IF_BUSY", "reject", choices=IF_BUSY_POLICIES)
    # The deployment's tool policy (docs/approvals.md#tool-policy): comma-separated tool names or
    # patterns; empty allow: every tool. Namespaces, sessions and turns narrow it further.
    tools_allow: tuple[str, ...] = env("AGENTMESH_GATEWAY_TOOLS_ALLOW", (), parse=_tool_entries)
    tools_deny: tuple[str, ...] = env("AGENTMESH_GATEWAY_TOOLS_DENY", (), parse=_tool_entries)
    # The permission mode of a session that has none set (docs/approvals.md#permission-modes).
    permission_mode: str = env("AGENTMESH_GATEWAY_PERMISSION_MODE", "auto", choices=PERMISSION_MODES)
    # Session routing across replicas (docs/api.md "Scaling the gateway"). No peers: this
    # replica serves every session itself, as a single gateway does.
    peers: PeerSpec = env("AGENTMESH_GATEWAY_PEERS", default_factory=PeerSpec, parse=PeerSpec.parse)
    advertise_address: str = env("AGENTMESH_GATEWAY_ADVERTISE_ADDR", "")
    peer_refresh_s: float = env("AGENTMESH_GATEWAY_PEER_REFRESH_S", 5.0, minimum=0.1)
    # How long a forwarded call waits to reach the owner before this replica serves it itself.
    peer_connect_timeout_s: float = env("AGENTMESH_GATEWAY_PEER_CONNECT_TIMEOUT_S", 2.0, minimum=0.05)
    # HTTP/JSON + SSE API and the web console (docs/api.md); "off" turns it off (""); port 0
    # takes a free port (tests).
    http_address: str = env("AGENTMESH_GATEWAY_HTTP_ADDR", "127.0.0.1:8080", parse=_http_address)
    # The largest file a client may upload into a session's workspace (the tools service has
    # its own bound, AGENTMESH_TOOLS_MAX_UPLOAD_BYTES; the smaller one holds). Small by default:
    # the gateway's gRPC receive bound grows with it (docs/security.md).
    max_upload_bytes: int = env("AGENTMESH_GATEWAY_MAX_UPLOAD_BYTES", 2 * 1024 * 1024, minimum=1024,
                                maximum=12 * 1024 * 1024)
    # Images a chat message may carry (ChatRequest.images; docs/api.md "Images"): how many, how
    # large each, and all of them together — which must fit one gRPC message (16 MiB).
    max_images: int = env("AGENTMESH_GATEWAY_MAX_IMAGES", 8, minimum=0, maximum=64)
    max_image_bytes: int = env("AGENTMESH_GATEWAY_MAX_IMAGE_BYTES", 5 * 1024 * 1024, minimum=1024,
                               maximum=12 * 1024 * 1024)
    max_images_total_bytes: int = env("AGENTMESH_GATEWAY_MAX_IMAGES_TOTAL_BYTES", 12 * 1024 * 1024, minimum=1024,
                                      maximum=12 * 1024 * 1024)
    # The largest HTTP request body; 0: an upload of max_upload_bytes as base64 and 1 MiB of room
    # (at least 4 MiB).
    http_max_body_bytes: int = env("AGENTMESH_GATEWAY_HTTP_MAX_BODY_BYTES", 0, minimum=0)
    # Slow and greedy HTTP clients (docs/security.md): a request's head must arrive within the
    # header timeout (counted from the connection or the head's first byte), its body within the
    # body timeout; a connection idle between requests is closed after the idle timeout; one
    # client address holds at most so many connections at once (0: no cap — behind a proxy or
    # ingress every client has the proxy's address: raise it, or set 0 and cap at the proxy).
    http_header_timeout_s: float = env("AGENTMESH_GATEWAY_HTTP_HEADER_TIMEOUT_S", 10.0, minimum=0.1)
    http_body_timeout_s: float = env("AGENTMESH_GATEWAY_HTTP_BODY_TIMEOUT_S", 60.0, minimum=0.1)
    http_idle_timeout_s: float = env("AGENTMESH_GATEWAY_HTTP_IDLE_TIMEOUT_S", 30.0, minimum=0.1)
    http_max_connections_per_ip: int = env("AGENTMESH_GATEWAY_HTTP_MAX_CONNECTIONS_PER_IP", 256, minimum=0)
    # Open protocols on the HTTP address (docs/api.md): each namespace's agent as an A2A agent
    # (/.well-known/agent-card.json, /a2a/<namespace>/) and an MCP server with ask_agent (/mcp).
    a2a: bool = env("AGENTMESH_GATEWAY_A2A", True)
    mcp: bool = env("AGENTMESH_GATEWAY_MCP", True)
    # How many A2A hops deep a message may arrive (agentmesh agents calling each other as tools
    # count them in the message's metadata); a deeper one is rejected, which ends loops.
    a2a_max_depth: int = env("AGENTMESH_GATEWAY_A2A_MAX_DEPTH", 3, minimum=0, maximum=32)
    # What the agent card and the MCP server say the agent is for.
    agent_description: str = env("AGENTMESH_GATEWAY_AGENT_DESCRIPTION", DEFAULT_AGENT_DESCRIPTION)
    # The address clients reach the HTTP API at (behind an ingress), for the card's URLs;
    # "": the scheme and Host of each request.
    public_url: str = env("AGENTMESH_GATEWAY_PUBLIC_URL", "", parse=_public_url)
    # Run webhooks (docs/api.md "Webhooks"): a URL resolving to a loopback, link-local or
    # private address is refused unless allowed here (web_fetch's egress policy, agentmesh.egress);
    # failed deliveries are retried after retry_base_s, doubling, up to max_attempts in all.
    webhook_allow_private: bool = env("AGENTMESH_GATEWAY_WEBHOOK_ALLOW_PRIVATE", False)
    webhook_retry_base_s: float = env("AGENTMESH_GATEWAY_WEBHOOK_RETRY_BASE_S", 5.0, minimum=0.01)
    webhook_max_attempts: int = env("AGENTMESH_GATEWAY_WEBHOOK_MAX_ATTEMPTS", 8, minimum=1, maximum=30)

    @property
    def max_request_bytes(self) -> int:
        """The largest request the gateway reads: a message of `max_message_chars` characters
        (at most 4 bytes each in UTF-8) or an upload of `max_upload_bytes`, and the rest of a
        request, with headroom; at least 1 MiB."""
        images = self.max_images_total_bytes if self.max_images else 0
        return max(1024 * 1024, 4 * self.max_message_chars + images + 256 * 1024, self.max_upload_bytes + 256 * 1024)

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
        if not self.http_max_body_bytes:
            # Base64 is 4/3 of the bytes; the JSON around it and a chat message fit in the rest.
            images = self.max_images_total_bytes if self.max_images else 0
            derived = max(4 * 1024 * 1024, max(self.max_upload_bytes, images) * 4 // 3 + 1024 * 1024)
            object.__setattr__(self, "http_max_body_bytes", derived)
