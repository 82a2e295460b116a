"""What a ledger's metadata keeps of its password, and the keys derived from it.

A ledger has two keys (both 20 bytes):

- the **master key**, sent to bookies with every add and fencing read; a bookie records it
  with the ledger's first add or fence and refuses the others (EUA);
- the **MAC key** of the ``hmac`` digest, which readers use to check that an entry is the
  writer's.

The metadata stores a :class:`KeyRecord`: how the keys derive from the password (scheme,
per-ledger random salt, iteration count) and the master key -- what autorecovery and an admin
need to fence, recover and re-replicate a ledger without its password. It never stores the
password nor the MAC key: a reader of the metadata cannot learn the password (other than by
guessing it, one PBKDF2 per guess and ledger), cannot forge an ``hmac`` ledger's entries, and
the master key of one ledger opens no other (the salt differs).

Schemes:

==================  ===========================================================================
``pbkdf2-sha256``   root = PBKDF2-HMAC-SHA256(password, salt, iterations); master key =
                    HMAC-SHA256(root, "bkspark ledger master key")[:20]; MAC key =
                    HMAC-SHA256(root, "bkspark ledger mac key")[:20]. Every new ledger.
``sha1``            master key = SHA1("ledger" || password), MAC key = SHA1("mac" || password),
                    no salt: Apache BookKeeper's rule, kept for ledgers written by format-1
                    metadata (which stored the password itself; read, it becomes this record).
==================  ===========================================================================
"""
from __future__ import annotations

import functools
import hashlib
import hmac
import os
from dataclasses import dataclass
from typing import NamedTuple

from bkspark.errors import BadRequestError

SCHEME_PBKDF2 = "pbkdf2-sha256"
SCHEME_SHA1 = "sha1"
SCHEMES = (SCHEME_PBKDF2, SCHEME_SHA1)
#: PBKDF2 rounds of a new ledger (~2 ms on one core of the test machine, 2026-11-27); a
#: record keeps its own count, so raising this changes new ledgers only
ITERATIONS = 10_000
MAX_ITERATIONS = 10_000_000
SALT_BYTES = 16
KEY_BYTES = 20          # a bookie's master key length (bookie_native: AF_MASTER_KEY_LEN)
_DERIVED_CACHE = 1024   # (record, password) pairs whose keys are remembered per process


class LedgerKeys(NamedTuple):
    """The keys a client uses for one ledger. ``mac_key`` is None when it is not known: a
    ledger opened from its metadata alone (autorecovery, an admin) without the password."""
    master_key: bytes
    mac_key: bytes | None


@dataclass(frozen=True)
class KeyRecord:
    """The stored part of a ledger's keys (see the module docstring)."""
    scheme: str
    salt: bytes
    iterations: int
    master_key: bytes

    @classmethod
    def for_password(cls, password: bytes, *, iterations: int = ITERATIONS) -> "KeyRecord":
        """The record of a new ledger: a fresh random salt."""
        salt = os.urandom(SALT_BYTES)
        keys = _derive(SCHEME_PBKDF2, salt, iterations, bytes(password))
        return cls(SCHEME_PBKDF2, salt, iterations, keys.master_key)

    @classmethod
    def legacy(cls, password: bytes) -> "KeyRecord":
        """The record of a ledger whose format-1 metadata held ``password`` itself."""
        return cls(SCHEME_SHA1, b"", 0, _derive(SCHEME_SHA1, b"", 0, bytes(password)).master_key)

    def validate(self) -> "KeyRecord":
        """:raises BadRequestError: what is wrong."""
        if self.scheme not in SCHEMES:
            raise BadRequestError(f"ledger keys: unknown scheme {self.scheme!r} (known: "
                                  f"{', '.join(SCHEMES)})")
        if not isinstance(self.salt, bytes) or not isinstance(self.master_key, bytes):
            raise BadRequestError("ledger keys: salt and master key must be bytes")
        if not isinstance(self.iterations, int) or isinstance(self.iterations, bool):
            raise BadRequestError(f"ledger keys: iterations must be an int, got "
                                  f"{self.iterations!r}")
        if len(self.master_key) != KEY_BYTES:
            raise BadRequestError(f"ledger keys: master key of {len(self.master_key)} bytes, "
                                  f"expected {KEY_BYTES}")
        if self.scheme == SCHEME_SHA1:
            if self.salt or self.iterations:
                raise BadRequestError("ledger keys: the sha1 scheme has no salt nor iterations")
        elif len(self.salt) != SALT_BYTES or not 1 <= self.iterations <= MAX_ITERATIONS:
            raise BadRequestError(f"ledger keys: {self.scheme} needs a {SALT_BYTES}-byte salt "
                                  f"and 1..{MAX_ITERATIONS} iterations, got "
                                  f"{len(self.salt)} bytes, {self.iterations}")
        return self

    def derive(self, password: bytes) -> LedgerKeys | None:
        """The keys of ``password``, or None if it is not this ledger's password (compared in
        constant time)."""
        keys = _derive(self.scheme, self.salt, self.iterations, bytes(password))
        return keys if hmac.compare_digest(keys.master_key, self.master_key) else None

    def stored_keys(self) -> LedgerKeys:
        """The keys known without the password: the master key only."""
        return LedgerKeys(self.master_key, None)


@functools.lru_cache(maxsize=_DERIVED_CACHE)
def _derive(scheme: str, salt: bytes, iterations: int, password: bytes) -> LedgerKeys:
    if scheme == SCHEME_SHA1:
        return LedgerKeys(hashlib.sha1(b"ledger" + password).digest(),
                          hashlib.sha1(b"mac" + password).digest())
    root = hashlib.pbkdf2_hmac("sha256", password, salt, iterations)
    return LedgerKeys(
        hmac.new(root, b"bkspark ledger master key", hashlib.sha256).digest()[:KEY_BYTES],
        hmac.new(root, b"bkspark ledger mac key", hashlib.sha256).digest()[:KEY_BYTES])
