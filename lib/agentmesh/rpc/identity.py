"""Service identities: one Ed25519 key pair per service, and the short-lived tokens signed with it.

Every internal call carries a JWT (EdDSA) that the calling service signs with its own private
key: `iss` is the caller (a service name), `aud` the service called, `sub` and `tenant` the
principal the call is made for, `exp` at most `TOKEN_LIFETIME_S` away. The receiver checks the
signature against the caller's public key, so a token proves which service sent it; no
secret is shared between services.

Keys live in one directory (`AGENTMESH_SERVICE_KEYS_DIR`, default `$AGENTMESH_HOME/keys`):

    <service>.key   the private key (PKCS#8 PEM, mode 0600) — only that service reads it
    <service>.pub   its public key (PEM), or
    <service>.crt   a certificate holding it (what the Helm chart and cert-manager provide)

Locally a service creates its own pair on first start. In a cluster the files come from
Kubernetes Secrets mounted read-only (docs/security.md).

Signing (~84 µs) and checking (~190 µs) an EdDSA token on every call cost a turn's dozen
internal calls several milliseconds of CPU, so both sides keep what they did: a caller reuses
the token it signed for an (audience, principal) for `TOKEN_REUSE_S`, half its lifetime, and a
receiver remembers the tokens it has already checked until they expire. Every call still
carries a token and is still checked against it; a remembered token is accepted exactly as long
as checking it again would accept it (never past its `exp`).
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from agentmesh.config import SERVICES, ConfigError

__all__ = [
    "ALGORITHM",
    "CLOCK_SKEW_S",
    "TOKEN_CACHE_ENTRIES",
    "TOKEN_LIFETIME_S",
    "TOKEN_REUSE_S",
    "IdentityError",
    "KeyDirectory",
    "KeyFileError",
    "Principal",
    "ServiceIdentity",
]

ALGORITHM = "EdDSA"
# Long enough for a call to reach its peer, short enough that a token seen in transit is soon useless.
TOKEN_LIFETIME_S = 60
# Clocks of two pods may disagree by this much.
CLOCK_SKEW_S = 10
# A signed token is reused for calls to the same service for the same principal this long, so
# every token still has at least half its lifetime left when it is sent.
TOKEN_REUSE_S = TOKEN_LIFETIME_S // 2
# Tokens remembered per direction (signed, checked): one per (peer, principal) in use.
TOKEN_CACHE_ENTRIES = 4096


class IdentityError(Exception):
    """A token or key cannot be trusted; the message says why, in words for a log or a caller."""


class KeyFileError(ConfigError):
    """This service's own key is missing and cannot be made, or unreadable: it cannot start."""


@dataclass(frozen=True)
class Principal:
    """On whose behalf a call runs: a user (`user:…`), or a service acting on its own (`service:…`)."""

    subject: str
    tenant: str = ""
    # The service that presented the call, when a service did ("" for a user's own call).
    via: str = ""


def _write_private(path: Path, data: bytes) -> None:
    """Create `path` with mode 0600 (never readable by others, even for a moment) unless it exists."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    try:
        # link() refuses an existing target: two processes starting at once keep the first key.
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink()


class KeyDirectory:
    """The key files of every service in one directory."""

    def __init__(self, path: Path):
        self.path = path

    def _private_path(self, service: str) -> Path:
        return self.path / f"{service}.key"

    def ensure_own(self, service: str) -> Ed25519PrivateKey:
        """This service's private key, created (with its public half) on first start."""
        key_path = self._private_path(service)
        if not key_path.exists():
            try:
                self.path.mkdir(parents=True, exist_ok=True, mode=0o700)
                _write_private(key_path, Ed25519PrivateKey.generate().private_bytes(
                    serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
            except OSError as exc:
                raise KeyFileError(
                    f"no private key for the {service} service at {key_path}, and it cannot be created ({exc.strerror}); "
                    "in a cluster mount the service's key Secret there (docs/security.md)"
                ) from None
        try:
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        except (OSError, ValueError) as exc:
            raise KeyFileError(f"cannot read the {service} service's private key at {key_path}: {exc}") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise KeyFileError(f"the key at {key_path} is not an Ed25519 key")
        if not (self.path / f"{service}.crt").exists():
            self._publish(service, key)
        return key

    def _publish(self, service: str, key: Ed25519PrivateKey) -> None:
        """Write `<service>.pub` for the others to check against, unless it already matches."""
        public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        pub_path = self.path / f"{service}.pub"
        try:
            if pub_path.read_bytes() == public:
                return
        except FileNotFoundError:
            pass
        tmp = pub_path.with_name(f".{pub_path.name}.{secrets.token_hex(4)}")
        tmp.write_bytes(public)
        tmp.replace(pub_path)

    def public_key(self, service: str) -> Ed25519PublicKey | None:
        """The public key of `service`, or None while it has none (it has not started yet)."""
        for suffix in (".pub", ".crt"):
            path = self.path / f"{service}{suffix}"
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise IdentityError(f"cannot read {path}: {exc.strerror}") from None
            try:
                key = (x509.load_pem_x509_certificate(data).public_key() if suffix == ".crt"
                       else serialization.load_pem_public_key(data))
            except ValueError as exc:
                raise IdentityError(f"{path} holds no readable public key: {exc}") from None
            if not isinstance(key, Ed25519PublicKey):
                raise IdentityError(f"{path} does not hold an Ed25519 public key")
            return key
        return None


class ServiceIdentity:
    """One service's signing key, and the public keys of the others to check what they send."""

    def __init__(self, service: str, keys: KeyDirectory):
        if service not in SERVICES:
            raise ValueError(f"unknown service {service!r}")
        self.service = service
        self.keys = keys
        self._private = keys.ensure_own(service)
        self._public: dict[str, Ed25519PublicKey] = {}
        # (audience, subject, tenant) -> (token, reuse until); token -> (principal, exp).
        self._signed: OrderedDict[tuple[str, str, str], tuple[str, float]] = OrderedDict()
        self._checked: OrderedDict[str, tuple[Principal, float]] = OrderedDict()
        self._lock = threading.Lock()  # the caches are shared by the gRPC threads and the loop

    @classmethod
    def open(cls, service: str, keys_dir: Path) -> "ServiceIdentity":
        return cls(service, KeyDirectory(keys_dir))

    def sign(self, audience: str, principal: Principal | None = None) -> str:
        """A token for one call from this service to `audience`, on behalf of `principal`."""
        now = int(time.time())
        principal = principal or Principal(subject=f"service:{self.service}")
        claims = {
            "iss": self.service,
            "aud": audience,
            "sub": principal.subject,
            "tenant": principal.tenant,
            "iat": now,
            "nbf": now,
            "exp": now + TOKEN_LIFETIME_S,
            "jti": secrets.token_hex(8),
        }
        return jwt.encode(claims, self._private, algorithm=ALGORITHM, headers={"kid": self.service})

    def token(self, audience: str, principal: Principal | None = None) -> str:
        """A token for a call to `audience` on behalf of `principal`: the one signed for them
        within the last `TOKEN_REUSE_S`, or a new one."""
        principal = principal or Principal(subject=f"service:{self.service}")
        key = (audience, principal.subject, principal.tenant)
        now = time.time()
        with self._lock:
            cached = self._signed.get(key)
            if cached is not None and now < cached[1]:
                return cached[0]
        token = self.sign(audience, principal)
        with self._lock:
            self._signed[key] = (token, now + TOKEN_REUSE_S)
            self._signed.move_to_end(key)
            while len(self._signed) > TOKEN_CACHE_ENTRIES:
                self._signed.popitem(last=False)
        return token

    def _key_of(self, service: str) -> Ed25519PublicKey:
        key = self._public.get(service)
        if key is None:
            # Read on first use: locally a peer may create its key after this service started.
            key = self.keys.public_key(service)
            if key is None:
                raise IdentityError(f"the {service} service has no public key in {self.keys.path} to check its token against")
            self._public[service] = key
        return key

    def _decode(self, token: str, issuer: str) -> dict[str, Any]:
        claims: dict[str, Any] = jwt.decode(
            token, self._key_of(issuer), algorithms=[ALGORITHM], audience=self.service, leeway=CLOCK_SKEW_S,
            options={"require": ["iss", "aud", "sub", "exp", "iat"]},
        )
        return claims

    def verify(self, token: str) -> Principal:
        """The principal a token from another service speaks for, once its signature,
        audience and lifetime are checked. IdentityError says what is wrong. A token already
        checked is accepted again until its `exp`, without checking the signature again."""
        with self._lock:
            checked = self._checked.get(token)
        if checked is not None and time.time() < checked[1]:
            return checked[0]
        principal, expires = self._verify(token)
        with self._lock:
            self._checked[token] = (principal, expires)
            while len(self._checked) > TOKEN_CACHE_ENTRIES:
                self._checked.popitem(last=False)
        return principal

    def _verify(self, token: str) -> tuple[Principal, float]:
        try:
            unverified = jwt.get_unverified_header(token)
            issuer = jwt.decode(token, options={"verify_signature": False}).get("iss")
        except jwt.PyJWTError:
            raise IdentityError("the service token is not a well-formed JWT") from None
        if issuer not in SERVICES or unverified.get("kid", issuer) != issuer:
            raise IdentityError("the service token names no known agentmesh service as its issuer")
        try:
            try:
                claims = self._decode(token, issuer)
            except jwt.InvalidSignatureError:
                # The peer may have a new key (rotated Secret, re-created home): read it again once.
                self._public.pop(issuer, None)
                claims = self._decode(token, issuer)
        except jwt.ExpiredSignatureError:
            raise IdentityError(f"the {issuer} service's token has expired (check the clocks of both hosts)") from None
        except jwt.InvalidAudienceError:
            raise IdentityError(f"the {issuer} service's token is addressed to another service, not {self.service}") from None
        except jwt.InvalidSignatureError:
            raise IdentityError(f"the token claiming to come from the {issuer} service is not signed with its key") from None
        except jwt.PyJWTError as exc:
            raise IdentityError(f"the {issuer} service's token is not valid: {exc}") from None
        if claims["iat"] > time.time() + CLOCK_SKEW_S or claims["exp"] - claims["iat"] > TOKEN_LIFETIME_S:
            raise IdentityError(f"the {issuer} service's token claims a lifetime longer than {TOKEN_LIFETIME_S}s")
        principal = Principal(subject=str(claims["sub"]), tenant=str(claims.get("tenant", "")), via=issuer)
        return principal, float(claims["exp"])
