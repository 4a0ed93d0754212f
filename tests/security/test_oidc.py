"""OIDC sign-in at the gateway: JWTs checked against a real issuer's discovery document and
JWKS, served over HTTP by the test with keys it generates (RS256 and ES256). Each case asks
the gateway over gRPC and over HTTP and checks the status a client sees, and the sentence."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
from pathlib import Path

import grpc
import httpx
import jwt
import pytest

from agentmesh.v1 import gateway_pb2, sessions_pb2
from tests.support.oidc_server import AUDIENCE, OidcIssuer, new_key
from tests.support.stack import Stack

pytestmark = pytest.mark.asyncio


def _policy(issuer: str, refresh_s: float = 1.0, max_age_s: float = 3600) -> str:
    return json.dumps({
        "oidc": {"issuer": issuer, "audience": AUDIENCE, "groups_claim": "groups", "clock_skew_s": 5,
                 "jwks_refresh_min_s": refresh_s, "jwks_max_age_s": max_age_s},
        "tenants": {"team-a": {"namespaces": ["team-a"], "members": [{"group": "team-a", "role": "member"}]}},
    })


@pytest.fixture
async def issuer():
    async with OidcIssuer() as running:
        yield running


@pytest.fixture
async def gateway(tmp_path: Path, issuer: OidcIssuer):
    policy = tmp_path / "policy.json"
    policy.write_text(_policy(issuer.url))
    audit = tmp_path / "audit.jsonl"
    env = {"AGENTMESH_AUTH_POLICY": str(policy), "AGENTMESH_AUDIT_LOG": str(audit)}
    async with Stack(tmp_path / "home", env=env, services=("memory", "gateway")) as stack:
        async with httpx.AsyncClient(base_url=stack.http_url, timeout=30) as http:
            yield stack.gateway_stub(), http, audit


async def _ask(gateway, token: str) -> tuple[grpc.StatusCode, str, int, dict]:
    stub, http, _audit = gateway
    try:
        await stub.ListSessions(sessions_pb2.ListSessionsRequest(), metadata=(("authorization", f"Bearer {token}"),))
        code, details = grpc.StatusCode.OK, ""
    except grpc.aio.AioRpcError as err:
        code, details = err.code(), err.details() or ""
    answer = await http.get("/v1/sessions", headers={"Authorization": f"Bearer {token}"})
    return code, details, answer.status_code, answer.json()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@pytest.mark.parametrize("kid", ["rsa-1", "ec-1"])
async def test_a_valid_token_signs_in(gateway, issuer, kid):
    code, _, status, body = await _ask(gateway, issuer.token(issuer.key(kid)))
    assert code == grpc.StatusCode.OK and status == 200 and body.get("sessions", []) == []


async def test_the_principal_is_the_tokens_subject_with_its_tenant(gateway, issuer):
    stub, _http, audit = gateway
    created = await stub.CreateSession(gateway_pb2.CreateSessionRequest(title="mine"),
                                       metadata=(("authorization", f"Bearer {issuer.token()}"),))
    assert created.namespace == "team-a"  # the tenant's namespace, not "default"
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    assert any(e["action"] == "session.create" and e["principal"] == "oidc:ada" and e["tenants"] == "team-a=member"
               for e in lines)


@pytest.mark.parametrize(("case", "expected"), [
    ("expired", "the token has expired"),
    ("wrong_audience", "another audience"),
    ("wrong_issuer", "issued by someone else"),
    ("alg_none", "unsigned (alg 'none')"),
    ("hs256_with_public_key", "shared-secret algorithm"),
    ("tampered_payload", "signature does not match"),
    ("not_a_member", "member of no tenant"),
])
async def test_a_bad_token_is_refused_with_a_reason(gateway, issuer, case, expected):
    now = int(time.time())
    if case == "expired":
        token = issuer.token(iat=now - 600, nbf=now - 600, exp=now - 60)
    elif case == "wrong_audience":
        token = issuer.token(aud="someone-else")
    elif case == "wrong_issuer":
        token = issuer.token(iss="https://evil.example")
    elif case == "alg_none":
        token = jwt.encode(issuer.claims(), None, algorithm="none")  # type: ignore[arg-type]
    elif case == "hs256_with_public_key":
        # The classic confusion attack: an HMAC "signed" with the issuer's public key bytes.
        public = json.dumps(issuer.keys[0].public_jwk()).encode()
        signing_input = f"{_b64(json.dumps({'alg': 'HS256', 'kid': 'rsa-1'}).encode())}.{_b64(json.dumps(issuer.claims()).encode())}"
        token = f"{signing_input}.{_b64(hmac.new(public, signing_input.encode(), hashlib.sha256).digest())}"
    elif case == "tampered_payload":
        header, _payload, signature = issuer.token(sub="ada").split(".")
        token = f"{header}.{_b64(json.dumps(issuer.claims(sub='root', groups=['team-a'])).encode())}.{signature}"
    else:
        token = issuer.token(groups=["other-team"])
    code, details, status, body = await _ask(gateway, token)
    wanted = grpc.StatusCode.PERMISSION_DENIED if case == "not_a_member" else grpc.StatusCode.UNAUTHENTICATED
    assert code == wanted, details
    assert expected in details
    assert status == (403 if case == "not_a_member" else 401)
    assert expected in body["error"]["message"]
    _stub, _http, audit = gateway
    refused = [json.loads(line) for line in audit.read_text().splitlines()]
    assert any(e["action"] == "login.refused" and expected in e["reason"] for e in refused)
    assert token not in audit.read_text()  # a refused credential is named by fingerprint only


async def test_an_unknown_kid_is_refused_until_the_issuer_publishes_it(gateway, issuer):
    assert (await _ask(gateway, issuer.token()))[0] == grpc.StatusCode.OK  # keys cached
    rotated = new_key("ES256", kid="ec-2")
    token = issuer.token(rotated)
    code, details, status, _ = await _ask(gateway, token)
    assert code == grpc.StatusCode.UNAUTHENTICATED and "does not publish" in details and status == 401
    # A burst of unknown kids within the refresh interval fetches the keys no more than once more.
    fetched = issuer.fetches["jwks"]
    for index in range(5):
        await _ask(gateway, issuer.token(new_key("ES256", kid=f"forged-{index}")))
    assert issuer.fetches["jwks"] - fetched <= 1
    # The issuer rotates: the new key is published, the old one retired.
    issuer.keys = [rotated]
    await asyncio.sleep(1.1)  # the policy's jwks_refresh_min_s
    code, details, status, _ = await _ask(gateway, token)
    assert code == grpc.StatusCode.OK and status == 200, details


async def test_missing_credentials_are_unauthenticated(gateway):
    stub, http, _ = gateway
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.ListSessions(sessions_pb2.ListSessionsRequest())
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "missing credentials" in refused.value.details()
    answer = await http.get("/v1/sessions")
    assert answer.status_code == 401 and answer.headers["WWW-Authenticate"].startswith("Bearer")


async def test_known_keys_keep_working_while_the_issuer_is_down(tmp_path, issuer):
    policy = tmp_path / "policy.json"
    policy.write_text(_policy(issuer.url, refresh_s=0.2, max_age_s=0.5))
    async with Stack(tmp_path / "home", env={"AGENTMESH_AUTH_POLICY": str(policy)}, services=("memory", "gateway")) as stack:
        async with httpx.AsyncClient(base_url=stack.http_url, timeout=30) as http:
            running = (stack.gateway_stub(), http, tmp_path / "no-audit")
            assert (await _ask(running, issuer.token()))[0] == grpc.StatusCode.OK
            await issuer.__aexit__(None, None, None)  # the identity provider goes away
            await asyncio.sleep(0.6)  # past jwks_max_age_s: a refresh is due and fails
            code, details, status, _ = await _ask(running, issuer.token())
            assert code == grpc.StatusCode.OK and status == 200, details
            # A key it never published still cannot sign anyone in.
            code, details, _, _ = await _ask(running, issuer.token(new_key("ES256", kid="new")))
            assert code == grpc.StatusCode.UNAUTHENTICATED
