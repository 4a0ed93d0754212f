"""Which gateway replica owns a session: rendezvous hashing over the replicas' addresses.

Plain Python, no I/O and no gRPC. Every replica computes the same owner from the same peer list,
so a session's turns, cancels and approvals meet on one replica without a shared store. With
rendezvous (highest-random-weight) hashing, a replica leaving moves only the sessions it owned,
and a replica joining takes a fair share from each of the others and moves nothing else.
"""

from __future__ import annotations

import hashlib
import ipaddress
from dataclasses import dataclass
from typing import Iterable

from agentmesh.config import ConfigError

DNS_SCHEME = "dns:///"


def normalize_address(address: str) -> str:
    """`host:port` in one spelling, so a replica recognises itself in the peer list: IPv6 hosts
    in brackets (`$(POD_IP):50051` with an IPv6 pod IP gives `fd00::1:50051`), no blanks."""
    address = address.strip()
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{address!r} is not host:port")
    host = host.strip("[]")
    try:
        if ipaddress.ip_address(host).version == 6:
            return f"[{host}]:{int(port)}"
    except ValueError:
        if ":" in host:
            raise ValueError(f"{address!r} is not host:port") from None
    return f"{host}:{int(port)}"


@dataclass(frozen=True)
class PeerSpec:
    """AGENTMESH_GATEWAY_PEERS parsed: a fixed list of addresses, or a DNS name to resolve
    periodically (a Kubernetes headless Service lists the Ready pods)."""

    static: tuple[str, ...] = ()
    dns_name: str = ""
    dns_port: int = 0

    @property
    def enabled(self) -> bool:
        return bool(self.static or self.dns_name)

    @classmethod
    def parse(cls, raw: str, variable: str = "AGENTMESH_GATEWAY_PEERS") -> "PeerSpec":
        raw = raw.strip()
        if not raw:
            return cls()
        if raw.startswith(DNS_SCHEME):
            try:
                target = normalize_address(raw[len(DNS_SCHEME):])
            except ValueError:
                raise ConfigError(f"{variable}: expected dns:///NAME:PORT, got {raw!r}") from None
            name, _, port = target.rpartition(":")
            return cls(dns_name=name.strip("[]"), dns_port=int(port))
        try:
            peers = tuple(sorted({normalize_address(part) for part in raw.split(",") if part.strip()}))
        except ValueError as exc:
            raise ConfigError(f"{variable}: each entry is host:port ({exc})") from None
        return cls(static=peers)


def _weight(peer: str, key: str) -> int:
    # A stable hash (never Python's salted hash()): every replica and every restart agree.
    digest = hashlib.blake2b(f"{peer}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def owner_of(key: str, peers: Iterable[str]) -> str | None:
    """The peer with the highest weight for `key`; ties (practically impossible) go to the
    greater address so the answer never depends on the list's order. None for no peers."""
    best: tuple[int, str] | None = None
    for peer in peers:
        candidate = (_weight(peer, key), peer)
        if best is None or candidate > best:
            best = candidate
    return best[1] if best else None
