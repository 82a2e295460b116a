"""Signed tokens: an Ed25519 JWT (``alg`` EdDSA) with a subject, a role and an expiry.

The holder of the signing key (``bkspark auth mint-token``, a local cluster at its first
start) mints them; servers are given the public key only (``auth_token_public_key_file``), so
a compromised bookie cannot mint a token. Tokens are bearer credentials: send them over TLS
beyond loopback.

Verification (:class:`TokenVerifier`) checks the signature, ``exp`` (60 s leeway for clocks
that disagree), ``iss`` and the role; a verified token is remembered (at most
``CACHE_ENTRIES``, least recently used dropped) so that a connection's calls cost a
dictionary lookup, and its expiry is checked again on each use.
"""
from __future__ import annotations

import collections
import math
import threading
import typing
import time
import uuid

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from bkspark.auth.roles import Role, role_named, role_of
from bkspark.errors import BadRequestError, UnauthorizedError

ALGORITHM = "EdDSA"
ISSUER = "bkspark"
LEEWAY_S = 60
CACHE_ENTRIES = 1024


def new_signing_key() -> bytes:
    """A new Ed25519 private key (PEM, unencrypted: keep the file 0600)."""
    return ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption())


def public_key_of(signing_key_pem: bytes) -> bytes:
    """The PEM public key that verifies tokens signed with ``signing_key_pem``."""
    key = serialization.load_pem_private_key(signing_key_pem, password=None)
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo)


def mint(signing_key_pem: bytes, subject: str, role: Role | str, ttl_s: float) -> str:
    """A token for ``subject`` with ``role``, valid ``ttl_s`` seconds from now."""
    role = role_of(role)
    if ttl_s <= 0:
        raise BadRequestError(f"a token's lifetime must be positive, got {ttl_s}")
    now = int(time.time())
    claims = {"iss": ISSUER, "sub": subject, "role": role.label, "iat": now,
              "exp": now + int(ttl_s), "jti": uuid.uuid4().hex}
    return jwt.encode(claims, serialization.load_pem_private_key(signing_key_pem, None),
                      algorithm=ALGORITHM)


def read_token_file(path: str) -> str:
    """The token in ``path`` (surrounding whitespace dropped); BadRequestError naming the file."""
    try:
        with open(path) as f:
            token = f.read().strip()
    except OSError as exc:
        raise BadRequestError(f"cannot read token file {path}: {exc.strerror}") from None
    if not token:
        raise BadRequestError(f"token file {path} is empty")
    return token


class Identity(typing.NamedTuple):
    """An authenticated peer: its subject, its role, and until when (wall-clock seconds) its
    credentials hold -- a connection admitted once (the data port) ends with them."""

    subject: str
    role: Role
    expires: float = math.inf


class TokenVerifier:
    """Verifies tokens against one public key (PEM), remembering verified ones."""

    def __init__(self, public_key_pem: bytes) -> None:
        try:
            self._key = serialization.load_pem_public_key(public_key_pem)
        except ValueError as exc:
            raise BadRequestError(f"not a PEM public key: {exc}") from None
        if not isinstance(self._key, ed25519.Ed25519PublicKey):
            raise BadRequestError("the token key must be an Ed25519 public key "
                                  "(bkspark auth new-key makes one)")
        self._cache: collections.OrderedDict[str, tuple[Identity, int]] = \
            collections.OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def from_file(cls, path: str) -> "TokenVerifier":
        try:
            with open(path, "rb") as f:
                return cls(f.read())
        except OSError as exc:
            raise BadRequestError(f"cannot read token public key {path}: {exc.strerror}") \
                from None

    def verify(self, token: str) -> Identity:
        """The token's identity; UnauthorizedError saying why it is refused."""
        with self._lock:
            hit = self._cache.get(token)
            if hit is not None:
                self._cache.move_to_end(token)
        if hit is not None:
            identity, expires = hit
            if time.time() <= expires + LEEWAY_S:
                return identity
            with self._lock:
                self._cache.pop(token, None)
            raise UnauthorizedError("token expired")
        try:
            claims = jwt.decode(token, self._key, algorithms=[ALGORITHM], issuer=ISSUER,
                                leeway=LEEWAY_S, options={"require": ["exp", "sub", "iss"]})
            identity = Identity(str(claims["sub"]), role_named(claims.get("role", "")),
                                float(claims["exp"]) + LEEWAY_S)
        except jwt.ExpiredSignatureError:
            raise UnauthorizedError("token expired") from None
        except (jwt.InvalidTokenError, ValueError) as exc:
            raise UnauthorizedError(f"invalid token: {exc}") from None
        with self._lock:
            self._cache[token] = (identity, int(claims["exp"]))
            while len(self._cache) > CACHE_ENTRIES:
                self._cache.popitem(last=False)
        return identity
