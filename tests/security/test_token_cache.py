"""Service tokens are reused by their signer and remembered by their checker — never past the
point where checking them afresh would refuse them."""

from __future__ import annotations

import time

import jwt
import pytest

from agentmesh.rpc.identity import TOKEN_REUSE_S, IdentityError, Principal, ServiceIdentity


def test_a_signer_reuses_its_token_per_audience_and_principal(tmp_path):
    agent = ServiceIdentity.open("agent", tmp_path / "keys")
    alice, bob = Principal("user:alice"), Principal("user:bob", tenant="t2")
    first = agent.token("memory", alice)
    assert agent.token("memory", alice) == first  # reused: no signing on every call
    assert agent.token("tools", alice) != first and agent.token("memory", bob) != first
    claims = jwt.decode(first, options={"verify_signature": False})
    assert claims["sub"] == "user:alice" and claims["aud"] == "memory"
    # Reused for half its lifetime at most: a reused token always has that much life left.
    assert claims["exp"] - time.time() > TOKEN_REUSE_S - 2


def test_a_checker_remembers_a_token_only_until_it_expires(tmp_path):
    keys = tmp_path / "keys"
    agent, memory = ServiceIdentity.open("agent", keys), ServiceIdentity.open("memory", keys)
    token = agent.token("memory", Principal("user:alice", tenant="acme"))
    assert memory.verify(token) == memory.verify(token) == Principal("user:alice", tenant="acme", via="agent")

    # A token that expired while remembered is checked afresh, and refused as before.
    now = int(time.time())
    short = jwt.encode({"iss": "agent", "aud": "memory", "sub": "x", "iat": now - 55, "nbf": now - 55,
                        "exp": now - 11}, agent._private, algorithm="EdDSA", headers={"kid": "agent"})  # noqa: SLF001 - a real token, expired
    with pytest.raises(IdentityError, match="has expired"):
        memory.verify(short)
    # Only tokens that passed are remembered: a refused one is refused every time.
    with pytest.raises(IdentityError, match="addressed to another service"):
        memory.verify(agent.token("tools"))
    with pytest.raises(IdentityError, match="addressed to another service"):
        memory.verify(agent.token("tools"))

