"""Session ownership (rendezvous hashing), peer lists and membership refresh, without the wire."""

from __future__ import annotations

import collections
import socket

import pytest

from agentmesh.config import ConfigError
from agentmesh.gateway.membership import Membership
from agentmesh.gateway.routing import PeerSpec, normalize_address, owner_of
from agentmesh.gateway.settings import GatewaySettings

PEERS = ("10.0.0.1:50051", "10.0.0.2:50051", "10.0.0.3:50051")
SESSIONS = [f"s-{i}" for i in range(3000)]


def owners(peers) -> dict[str, str]:
    return {s: owner_of(s, peers) for s in SESSIONS}


def test_sessions_spread_evenly_over_the_replicas():
    counts = collections.Counter(owners(PEERS).values())
    assert set(counts) == set(PEERS)
    for peer, count in counts.items():
        assert 850 <= count <= 1150, (peer, count)  # a third each, give or take 15 %


def test_the_owner_does_not_depend_on_the_list_order_or_the_process():
    assert owners(PEERS) == owners(tuple(reversed(PEERS)))
    # blake2b, not Python's salted hash(): the same answer in every replica and every restart.
    assert owner_of("s-0", PEERS) == owner_of("s-0", list(PEERS))
    assert [owner_of(s, PEERS) for s in ("alpha", "beta", "gamma", "delta")] == [
        owner_of(s, sorted(PEERS)) for s in ("alpha", "beta", "gamma", "delta")
    ]
    assert owner_of("anything", ()) is None
    assert owner_of("anything", ["only:1"]) == "only:1"


def test_a_replica_leaving_moves_only_its_own_sessions():
    before = owners(PEERS)
    after = owners(PEERS[:2])
    moved = {s for s in SESSIONS if before[s] != after[s]}
    assert moved == {s for s in SESSIONS if before[s] == PEERS[2]}
    # ... and they spread over the survivors rather than piling onto one.
    assert len({after[s] for s in moved}) == 2


def test_a_replica_joining_takes_sessions_only_for_itself():
    before = owners(PEERS)
    newcomer = "10.0.0.4:50051"
    after = owners((*PEERS, newcomer))
    moved = [s for s in SESSIONS if before[s] != after[s]]
    assert moved and all(after[s] == newcomer for s in moved)
    assert 600 <= len(moved) <= 900  # about a quarter


@pytest.mark.parametrize("raw, expected", [
    ("10.0.0.1:50051", "10.0.0.1:50051"),
    (" gw-0.gw:50051 ", "gw-0.gw:50051"),
    ("fd00::1:50051", "[fd00::1]:50051"),  # $(POD_IP):50051 with an IPv6 pod IP
    ("[fd00::1]:50051", "[fd00::1]:50051"),
])
def test_addresses_have_one_spelling(raw, expected):
    assert normalize_address(raw) == expected


@pytest.mark.parametrize("raw", ["", "host", "host:", ":50051", "host:port", "host:70000", "a:b:c"])
def test_malformed_addresses_are_refused(raw):
    with pytest.raises(ValueError):
        normalize_address(raw)


def test_peer_specs():
    assert not PeerSpec.parse("").enabled
    spec = PeerSpec.parse("10.0.0.2:50051, 10.0.0.1:50051,,10.0.0.2:50051")
    assert spec.static == ("10.0.0.1:50051", "10.0.0.2:50051") and not spec.dns_name
    spec = PeerSpec.parse("dns:///agentmesh-gateway-peers.agentmesh.svc.cluster.local:50051")
    assert (spec.dns_name, spec.dns_port, spec.static) == ("agentmesh-gateway-peers.agentmesh.svc.cluster.local", 50051, ())
    for bad in ("dns:///no-port", "10.0.0.1", "dns:///name:port"):
        with pytest.raises(ConfigError, match="AGENTMESH_GATEWAY_PEERS"):
            PeerSpec.parse(bad)


def test_settings_need_an_advertised_address_with_peers():
    assert not GatewaySettings.from_env({}).peers.enabled
    with pytest.raises(ConfigError, match="AGENTMESH_GATEWAY_ADVERTISE_ADDR must be set"):
        GatewaySettings.from_env({"AGENTMESH_GATEWAY_PEERS": "a:1,b:2"})
    with pytest.raises(ConfigError, match="AGENTMESH_GATEWAY_ADVERTISE_ADDR"):
        GatewaySettings.from_env({"AGENTMESH_GATEWAY_PEERS": "a:1", "AGENTMESH_GATEWAY_ADVERTISE_ADDR": "a"})
    settings = GatewaySettings.from_env({
        "AGENTMESH_GATEWAY_PEERS": "dns:///gw:50051", "AGENTMESH_GATEWAY_ADVERTISE_ADDR": "fd00::7:50051",
        "AGENTMESH_GATEWAY_PEER_REFRESH_S": "2", "AGENTMESH_GATEWAY_PEER_CONNECT_TIMEOUT_S": "0.5",
    })
    assert settings.advertise_address == "[fd00::7]:50051"
    assert (settings.peer_refresh_s, settings.peer_connect_timeout_s) == (2.0, 0.5)
    with pytest.raises(ConfigError, match="AGENTMESH_GATEWAY_PEER_REFRESH_S"):
        GatewaySettings.from_env({"AGENTMESH_GATEWAY_PEER_REFRESH_S": "0"})


class FakeDNS:
    """Answers lookups from a list the test changes; `None` makes the next lookup fail."""

    def __init__(self, answer):
        self.answer = answer
        self.asked: list[tuple[str, int]] = []

    async def __call__(self, name: str, port: int) -> list[str]:
        self.asked.append((name, port))
        if self.answer is None:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return list(self.answer)


async def test_dns_membership_follows_the_answers_and_keeps_the_last_good_one():
    dns = FakeDNS(["10.0.0.2:50051", "10.0.0.1:50051"])
    membership = Membership(PeerSpec.parse("dns:///gw.ns.svc:50051"), "10.0.0.1:50051", refresh_s=3600, resolver=dns)
    seen = []
    membership.on_change(seen.append)
    await membership.start()
    try:
        assert dns.asked == [("gw.ns.svc", 50051)]
        assert membership.peers == ("10.0.0.1:50051", "10.0.0.2:50051")
        mine = [s for s in SESSIONS[:200] if membership.owner(s) == "10.0.0.1:50051"]
        theirs = [s for s in SESSIONS[:200] if membership.owner(s) == "10.0.0.2:50051"]
        assert mine and theirs
        assert all(membership.owned_elsewhere(s) is None for s in mine)
        assert all(membership.owned_elsewhere(s) == "10.0.0.2:50051" for s in theirs)

        dns.answer = None  # a resolver error: nothing changes
        await membership.refresh()
        assert membership.peers == ("10.0.0.1:50051", "10.0.0.2:50051")
        dns.answer = []  # no pod Ready for a moment: not "alone", keep the last answer
        await membership.refresh()
        assert membership.peers == ("10.0.0.1:50051", "10.0.0.2:50051")

        dns.answer = ["10.0.0.1:50051"]  # the other replica left: everything is served here
        await membership.refresh()
        assert membership.peers == ("10.0.0.1:50051",)
        assert all(membership.owned_elsewhere(s) is None for s in SESSIONS[:200])
        assert seen == [("10.0.0.1:50051", "10.0.0.2:50051"), ("10.0.0.1:50051",)]
    finally:
        await membership.stop()


async def test_a_static_list_is_used_as_given():
    dns = FakeDNS(None)
    membership = Membership(PeerSpec.parse("127.0.0.1:7001,127.0.0.1:7002"), "127.0.0.1:7002", resolver=dns)
    await membership.start()
    await membership.stop()
    assert dns.asked == [] and membership.peers == ("127.0.0.1:7001", "127.0.0.1:7002")
    # A replica missing from its own list serves nothing itself: every session has another owner.
    outsider = Membership(PeerSpec.parse("127.0.0.1:7001"), "127.0.0.1:7009")
    assert outsider.owned_elsewhere("s-1") == "127.0.0.1:7001"
    assert Membership(PeerSpec(), "127.0.0.1:7001").owned_elsewhere("s-1") is None


@pytest.mark.parametrize("handoff_window_s", [1800.0, 0.0])
async def test_after_a_change_the_previous_owner_is_known_for_the_sessions_that_moved(handoff_window_s):
    dns = FakeDNS(list(PEERS[:2]))
    me = PEERS[0]
    membership = Membership(PeerSpec.parse("dns:///gw:50051"), me, refresh_s=3600, resolver=dns,
                            handoff_window_s=handoff_window_s)
    await membership.start()
    try:
        assert all(membership.previous_owners(s) == [] for s in SESSIONS[:300])  # steady state
        before = owners(PEERS[:2])
        dns.answer = list(PEERS)  # a third replica joins
        await membership.refresh()
        after = owners(PEERS)
        if not handoff_window_s:
            # Past the longest a turn may run, no turn started before the change can be left.
            assert all(membership.previous_owners(s) == [] for s in SESSIONS[:300])
            return
        for s in SESSIONS[:300]:
            moved_from_other = before[s] != after[s] and before[s] != me
            assert membership.previous_owners(s) == ([before[s]] if moved_from_other else []), s
        assert any(membership.previous_owners(s) for s in SESSIONS[:300])
    finally:
        await membership.stop()
