"""A real OIDC issuer for tests: discovery and JWKS over HTTP, keys the test generates.

    async with OidcIssuer() as issuer:
        token = issuer.token(sub="ada", groups=["team-a"])          # RS256 by default
        issuer.rotate(add=issuer.new_key("ES256", kid="ec-2"))      # publish another key

Serves `/.well-known/openid-configuration` (naming itself as issuer and its `jwks_uri`) and
`/jwks` on 127.0.0.1 with a free port, and counts how often each is fetched.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import jwt
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import ec, rsa

AUDIENCE = "agentmesh"


@dataclass
class SigningKey:
    kid: str
    algorithm: str
    private: Any

    def public_jwk(self) -> dict[str, Any]:
        algorithm = jwt.get_algorithm_by_name(self.algorithm)
        jwk = json.loads(algorithm.to_jwk(self.private.public_key()))
        return {**jwk, "kid": self.kid, "alg": self.algorithm, "use": "sig"}


def new_key(algorithm: str = "RS256", kid: str = "rsa-1") -> SigningKey:
    if algorithm.startswith("RS"):
        return SigningKey(kid, algorithm, rsa.generate_private_key(public_exponent=65537, key_size=2048))
    if algorithm == "ES256":
        return SigningKey(kid, algorithm, ec.generate_private_key(ec.SECP256R1()))
    raise ValueError(algorithm)


class OidcIssuer:
    def __init__(self) -> None:
        self.keys: list[SigningKey] = [new_key("RS256", "rsa-1"), new_key("ES256", "ec-1")]
        self.fetches = {"discovery": 0, "jwks": 0}
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def __aenter__(self) -> "OidcIssuer":
        app = web.Application()
        app.router.add_get("/.well-known/openid-configuration", self._discovery)
        app.router.add_get("/jwks", self._jwks)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _discovery(self, request: web.Request) -> web.Response:
        self.fetches["discovery"] += 1
        return web.json_response({"issuer": self.url, "jwks_uri": f"{self.url}/jwks",
                                  "id_token_signing_alg_values_supported": ["RS256", "ES256"]})

    async def _jwks(self, request: web.Request) -> web.Response:
        self.fetches["jwks"] += 1
        return web.json_response({"keys": [key.public_jwk() for key in self.keys]})

    def key(self, kid: str) -> SigningKey:
        return next(k for k in self.keys if k.kid == kid)

    def claims(self, **overrides: Any) -> dict[str, Any]:
        now = int(time.time())
        claims = {"iss": self.url, "aud": AUDIENCE, "sub": "ada", "name": "Ada Lovelace",
                  "groups": ["/team-a"], "iat": now, "nbf": now, "exp": now + 300}
        claims.update(overrides)
        return {k: v for k, v in claims.items() if v is not None}

    def token(self, key: SigningKey | None = None, **overrides: Any) -> str:
        key = key or self.keys[0]
        return jwt.encode(self.claims(**overrides), key.private, algorithm=key.algorithm, headers={"kid": key.kid})
