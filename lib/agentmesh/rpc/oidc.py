"""OIDC sign-in: a user's JWT checked against the issuer's published keys (PyJWT + cryptography).

The issuer's keys are found the standard way — `{issuer}/.well-known/openid-configuration`
names `jwks_uri` — fetched once and cached. A token signed with a key id (`kid`) the cache does
not know makes one refetch (a rotated key), at most every `jwks_refresh_min_s`, so a flood of
made-up kids cannot become a flood of requests to the identity provider; the cache is also
refreshed after `jwks_max_age_s` so retired keys go. Only asymmetric algorithms are accepted:
`alg: none` and the shared-secret HS* family are refused before any key is looked at (an HS256
token "signed" with the public key must never verify). Issuer, audience, expiry and not-before
are checked with a bounded clock skew. Signatures are verified by PyJWT, never by hand.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import httpx
import jwt

from agentmesh.logs import get_logger
from agentmesh.tenancy import OidcSettings

__all__ = ["FETCH_TIMEOUT_S", "OidcError", "OidcIdentity", "OidcVerifier", "looks_like_jwt"]

log = get_logger("agentmesh.rpc.oidc")

FETCH_TIMEOUT_S = 5.0


class OidcError(Exception):
    """The token is not accepted; the message says why in words a person can act on."""


@dataclass(frozen=True)
class OidcIdentity:
    subject: str
    name: str
    groups: tuple[str, ...]


def looks_like_jwt(token: str) -> bool:
    return token.count(".") == 2 and token.startswith("ey")


class OidcVerifier:
    def __init__(self, settings: OidcSettings, client: httpx.AsyncClient | None = None):
        self.settings = settings
        self._client = client
        self._keys: dict[str, jwt.PyJWK] = {}
        self._fetched_at = 0.0
        self._jwks_uri = ""
        self._lock = asyncio.Lock()

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=FETCH_TIMEOUT_S, follow_redirects=False)
        return self._client

    async def _get_json(self, url: str, what: str) -> dict[str, Any]:
        try:
            response = await self._http().get(url, headers={"Accept": "application/json"})
        except httpx.HTTPError as exc:
            raise OidcError(f"the identity provider's {what} at {url} cannot be fetched ({type(exc).__name__})") from None
        if response.status_code != 200:
            raise OidcError(f"the identity provider's {what} at {url} answered HTTP {response.status_code}")
        try:
            body = response.json()
        except ValueError:
            raise OidcError(f"the identity provider's {what} at {url} is not JSON") from None
        if not isinstance(body, dict):
            raise OidcError(f"the identity provider's {what} at {url} is not a JSON object")
        return body

    async def _refresh(self) -> None:
        issuer = self.settings.issuer
        if not self._jwks_uri:
            discovery = await self._get_json(f"{issuer}/.well-known/openid-configuration", "discovery document")
            if str(discovery.get("issuer", "")).rstrip("/") != issuer:
                raise OidcError(f"the discovery document at {issuer} names another issuer ({discovery.get('issuer')!r})")
            jwks_uri = discovery.get("jwks_uri")
            if not isinstance(jwks_uri, str) or not jwks_uri:
                raise OidcError(f"the discovery document at {issuer} has no jwks_uri")
            self._jwks_uri = jwks_uri
        jwks = await self._get_json(self._jwks_uri, "key set (JWKS)")
        keys: dict[str, jwt.PyJWK] = {}
        for raw in jwks.get("keys") or ():
            if not isinstance(raw, dict) or raw.get("use", "sig") != "sig":
                continue
            try:
                key = jwt.PyJWK(raw)
            except jwt.PyJWTError:
                continue  # a key type this library cannot use is simply not offered
            keys[str(raw.get("kid", ""))] = key
        self._keys = keys
        self._fetched_at = time.monotonic()
        log.info("oidc keys fetched", issuer=issuer, kids=sorted(keys))

    async def _key(self, kid: str) -> jwt.PyJWK:
        async with self._lock:
            age = time.monotonic() - self._fetched_at
            if not self._keys:
                await self._refresh()
            elif age > self.settings.jwks_max_age_s or (kid not in self._keys and age >= self.settings.jwks_refresh_min_s):
                # Due, or a kid we do not know (the provider may have rotated its keys).
                await self._refresh_keeping_keys()
            key = self._keys.get(kid)
            if key is None and not kid and len(self._keys) == 1:
                key = next(iter(self._keys.values()))
        if key is None:
            raise OidcError(f"the token is signed with a key ({kid or 'no kid'!s}) the issuer {self.settings.issuer} does not publish")
        return key

    async def _refresh_keeping_keys(self) -> None:
        """Refresh; when the provider cannot be reached, keep signing users in with the keys
        already known (an IdP outage must not lock everyone out) and try again later."""
        try:
            await self._refresh()
        except OidcError as exc:
            self._fetched_at = time.monotonic()  # the next try waits the refresh interval
            log.warning("oidc keys not refreshed; the cached ones stay in use", issuer=self.settings.issuer,
                        error=str(exc))

    async def verify(self, token: str) -> OidcIdentity:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise OidcError("the bearer token is not a well-formed JWT") from None
        algorithm = str(header.get("alg", ""))
        if algorithm.lower() == "none" or not algorithm:
            raise OidcError("the token is unsigned (alg 'none'); only signed tokens are accepted")
        if algorithm.upper().startswith("HS"):
            raise OidcError(f"the token uses {algorithm}, a shared-secret algorithm; only the issuer's "
                            "public-key signatures are accepted")
        if algorithm not in self.settings.algorithms:
            raise OidcError(f"the token's algorithm {algorithm} is not accepted (accepted: {', '.join(self.settings.algorithms)})")
        key = await self._key(str(header.get("kid", "")))
        if key.algorithm_name and key.algorithm_name != algorithm:
            raise OidcError(f"the token says {algorithm} but its key is for {key.algorithm_name}")
        try:
            claims: dict[str, Any] = jwt.decode(
                token, key.key, algorithms=[algorithm], audience=self.settings.audience, issuer=self.settings.issuer,
                leeway=self.settings.clock_skew_s, options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError:
            raise OidcError("the token has expired; sign in again") from None
        except jwt.ImmatureSignatureError:
            raise OidcError("the token is not valid yet (check this host's clock)") from None
        except jwt.InvalidAudienceError:
            raise OidcError(f"the token is for another audience, not {self.settings.audience!r}") from None
        except jwt.InvalidIssuerError:
            raise OidcError(f"the token was issued by someone else, not {self.settings.issuer}") from None
        except jwt.InvalidSignatureError:
            raise OidcError("the token's signature does not match its content (it was altered or forged)") from None
        except jwt.MissingRequiredClaimError as exc:
            raise OidcError(f"the token lacks the {exc.claim!r} claim") from None
        except jwt.PyJWTError as exc:
            raise OidcError(f"the token is not valid: {exc}") from None
        subject = claims.get(self.settings.subject_claim)
        if not isinstance(subject, str) or not subject:
            raise OidcError(f"the token has no {self.settings.subject_claim!r} claim naming the user")
        groups = claims.get(self.settings.groups_claim) or ()
        if isinstance(groups, str):
            groups = (groups,)
        name = claims.get(self.settings.name_claim)
        return OidcIdentity(
            subject=subject,
            name=name if isinstance(name, str) else "",
            groups=tuple(str(g).lstrip("/") for g in groups if isinstance(g, (str, int))),
        )
