"""What identifying a user and keeping tenants apart cost.

    python -m benches.identity

1. Resolving one bearer token into a principal (agentmesh.rpc.users), per call: a static token,
   a service account (SHA-256 of the token against the policy's digests), and an OIDC JWT
   (RS256, ES256) checked against an issuer's keys served over HTTP by the bench and cached
   after the first fetch. Baseline in the same run: the static token with no policy file.
2. A ListSessions round trip through a real gateway and memory (gRPC on loopback), without a
   policy file (baseline) and with one (the gateway and memory check the tenant, memory filters
   the list by the caller's namespaces).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from agentmesh.rpc.users import UserAuthenticator
from agentmesh.tenancy import AuthPolicy, parse_policy, token_digest
from agentmesh.v1 import gateway_pb2, sessions_pb2
from tests.support.oidc_server import AUDIENCE, OidcIssuer
from tests.support.stack import Stack

ROUNDS = 2000
CALLS = 300
STATIC = "tok-static-0123456789abcdef"
ACCOUNT = "tok-account-0123456789abcdef"


def _policy(issuer: str) -> str:
    return json.dumps({
        "oidc": {"issuer": issuer, "audience": AUDIENCE},
        "tenants": {f"t{i}": {"namespaces": [f"ns{i}"], "members": [{"group": f"team-{i}", "role": "member"}]}
                    for i in range(50)} | {"team-a": {"namespaces": ["team-a"],
                                                      "members": [{"group": "team-a", "role": "member"}]}},
        "service_accounts": [{"name": f"sa{i}", "token_sha256": token_digest(f"{ACCOUNT}-{i}"), "tenant": "t1",
                              "role": "member"} for i in range(20)]
                            + [{"name": "ci", "token_sha256": token_digest(ACCOUNT), "tenant": "team-a", "role": "member"}],
    })


async def _per_call_us(users: UserAuthenticator, token: str) -> float:
    await users.authenticate(token)  # keys fetched and cached once
    started = time.perf_counter()
    for _ in range(ROUNDS):
        principal = await users.authenticate(token)
    elapsed = time.perf_counter() - started
    assert not hasattr(principal, "reason"), principal
    return elapsed / ROUNDS * 1e6


async def authentication() -> list[tuple[str, float]]:
    async with OidcIssuer() as issuer:
        policy = parse_policy(_policy(issuer.url)).with_static_tokens([STATIC])
        users = UserAuthenticator(policy)
        baseline = UserAuthenticator(AuthPolicy().with_static_tokens([STATIC]))
        rows = [
            ("static token, no policy file (baseline)", await _per_call_us(baseline, STATIC)),
            ("static token, policy of 51 tenants", await _per_call_us(users, STATIC)),
            ("service account (21 in the policy)", await _per_call_us(users, ACCOUNT)),
            ("OIDC JWT, RS256 (keys cached)", await _per_call_us(users, issuer.token(issuer.key("rsa-1"), groups=["team-a"]))),
            ("OIDC JWT, ES256 (keys cached)", await _per_call_us(users, issuer.token(issuer.key("ec-1"), groups=["team-a"]))),
        ]
        await users.close()
        await baseline.close()
        return rows


async def list_sessions_ms(policy_text: str | None) -> float:
    with tempfile.TemporaryDirectory() as home:
        env = {"AGENTMESH_LOG_LEVEL": "error", "AGENTMESH_TRACES": "none", "AGENTMESH_GATEWAY_HTTP_ADDR": "off"}
        metadata: tuple[tuple[str, str], ...] = ()
        if policy_text is not None:
            path = Path(home) / "policy.json"
            path.write_text(policy_text)
            env["AGENTMESH_AUTH_POLICY"] = str(path)
            metadata = (("authorization", f"Bearer {ACCOUNT}"),)
        async with Stack(Path(home) / "home", env=env, services=("memory", "gateway")) as stack:
            gateway = stack.gateway_stub()
            for index in range(20):
                await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id=f"s{index}"), metadata=metadata)
            samples = []
            for _ in range(CALLS):
                started = time.perf_counter()
                await gateway.ListSessions(sessions_pb2.ListSessionsRequest(), metadata=metadata)
                samples.append((time.perf_counter() - started) * 1000)
            return statistics.median(samples)


async def main() -> None:
    print(f"{'authentication, per call':44} {'µs':>8}")
    for name, micros in await authentication():
        print(f"{name:44} {micros:8.1f}")
    open_ms = await list_sessions_ms(None)
    enforced_ms = await list_sessions_ms(_policy("https://id.example.com"))
    print(f"\n{'ListSessions through gateway and memory':44} {'median ms':>10}")
    print(f"{'no policy file (baseline)':44} {open_ms:10.2f}")
    print(f"{'policy file: tenant checked at both':44} {enforced_ms:10.2f}")


if __name__ == "__main__":
    asyncio.run(main())
