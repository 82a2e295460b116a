"""What a ledger's metadata keeps of its password, and the keys derived from it.

A ledger has two keys (both 20 bytes):

- the **master key**, sent to bookies with every add and fencing read; a bookie records it
  with the ledger's first add or fence and refuses the others (EUA);
- the **MAC key** of the ``hmac`` digest, which readers use to check that an entry is the
  writer's.

The metadata stores a :class:`KeyRecord`: how the keys derive from the password (scheme,
random salt, iteration count) and both keys -- what autorecovery and an admin need to fence,
recover, verify and re-replicate a ledger without its password (a recovery or a copy that
could not check an entry's MAC would adopt a corrupt replica and write it over the good
ones). It never stores the password: a reader of the metadata cannot learn it (other than by
guessing, one PBKDF2 per guess and writer salt), and the keys of one ledger open no other
(its ledger salt differs). The keys themselves are as sensitive as the metadata is: protect
reads of it (ZooKeeper ACLs, a private SQLite file).

Schemes:

========================  =====================================================================
``pbkdf2-sha256-ledger``  salt = writer salt (16 bytes, drawn once per process and password)
                          || ledger salt (16 bytes, fresh per ledger); root =
                          PBKDF2-HMAC-SHA256(password, writer salt, iterations); ledger root =
                          HMAC-SHA256(root, ledger salt); master key = HMAC-SHA256(ledger
                          root, "bkspark ledger master key")[:20]; MAC key = HMAC-SHA256(ledger
                          root, "bkspark ledger mac key")[:20]. Every new ledger: one PBKDF2
                          per writer process, not per ledger -- opening or creating thousands
                          of a writer's ledgers derives once (2026-11-27: ~2.6 ms a PBKDF2,
                          ~30 us an HMAC), while every ledger keeps keys of its own.
``pbkdf2-sha256``         root = PBKDF2-HMAC-SHA256(password, salt, iterations) with a fresh
                          16-byte salt per ledger; keys as above from the root. Ledgers
                          created before 2026-11-28.
``sha1``                  master key = SHA1("ledger" || password), MAC key = SHA1("mac" ||
                          password), no salt: Apache BookKeeper's rule, kept for ledgers
                          written by format-1 metadata (which stored the password itself;
                          read, it becomes this record).
========================  =====================================================================
"""
from __future__ import annotations

import functools
import hashlib
import hmac
import os
from dataclasses import dataclass, field
from typing import NamedTuple

from bkspark.errors import BadRequestError

SCHEME_PBKDF2_LEDGER = "pbkdf2-sha256-ledger"
SCHEME_PBKDF2 = "pbkdf2-sha256"
SCHEME_SHA1 = "sha1"
SCHEMES = (SCHEME_PBKDF2_LEDGER, SCHEME_PBKDF2, SCHEME_SHA1)
#: PBKDF2 rounds of a new ledger (~2 ms on one core of the test machine, 2026-11-27); a
#: record keeps its own count, so raising this changes new ledgers only
ITERATIONS = 10_000
MAX_ITERATIONS = 1_000_000      # a record asking more is refused (~0.3 s an open at most)
SALT_BYTES = 16
KEY_BYTES = 20          # a bookie's master key length (bookie_native: AF_MASTER_KEY_LEN)
_DERIVED_CACHE = 1024   # (record, password) pairs whose keys are remembered per process
_ROOT_CACHE = 64        # (writer salt, password) roots remembered per process


class LedgerKeys(NamedTuple):
    """The keys a client uses for one ledger (never shown by ``repr``)."""
    master_key: bytes
    mac_key: bytes

    def __repr__(self) -> str:
        return "LedgerKeys(<hidden>)"


@dataclass(frozen=True)
class KeyRecord:
    """The stored part of a ledger's keys (see the module docstring)."""
    scheme: str
    salt: bytes
    iterations: int
    master_key: bytes = field(repr=False)
    mac_key: bytes = field(repr=False)

    @classmethod
    def for_password(cls, password: bytes, *, iterations: int = ITERATIONS) -> "KeyRecord":
        """The record of a new ledger: this process's writer salt for the password, and a
        fresh ledger salt."""
        password = bytes(password)
        salt = _writer_salt(password, iterations) + os.urandom(SALT_BYTES)
        return cls(SCHEME_PBKDF2_LEDGER, salt, iterations,
                   *_derive(SCHEME_PBKDF2_LEDGER, salt, iterations, password))

    @classmethod
    def legacy(cls, password: bytes) -> "KeyRecord":
        """The record of a ledger whose format-1 metadata held ``password`` itself."""
        return cls(SCHEME_SHA1, b"", 0, *_derive(SCHEME_SHA1, b"", 0, bytes(password)))

    def validate(self) -> "KeyRecord":
        """:raises BadRequestError: what is wrong."""
        if self.scheme not in SCHEMES:
            raise BadRequestError(f"ledger keys: unknown scheme {self.scheme!r} (known: "
                                  f"{', '.join(SCHEMES)})")
        if not all(isinstance(v, bytes) for v in (self.salt, self.master_key, self.mac_key)):
            raise BadRequestError("ledger keys: salt and keys must be bytes")
        if not isinstance(self.iterations, int) or isinstance(self.iterations, bool):
            raise BadRequestError(f"ledger keys: iterations must be an int, got "
                                  f"{self.iterations!r}")
        for name, key in (("master key", self.master_key), ("MAC key", self.mac_key)):
            if len(key) != KEY_BYTES:
                raise BadRequestError(f"ledger keys: {name} of {len(key)} bytes, expected "
                                      f"{KEY_BYTES}")
        if self.scheme == SCHEME_SHA1:
            if self.salt or self.iterations:
                raise BadRequestError("ledger keys: the sha1 scheme has no salt nor iterations")
        elif len(self.salt) != _salt_bytes(self.scheme) or \
                not 1 <= self.iterations <= MAX_ITERATIONS:
            raise BadRequestError(f"ledger keys: {self.scheme} needs a "
                                  f"{_salt_bytes(self.scheme)}-byte salt and "
                                  f"1..{MAX_ITERATIONS} iterations, got "
                                  f"{len(self.salt)} bytes, {self.iterations}")
        return self

    def derive(self, password: bytes) -> LedgerKeys | None:
        """The keys of ``password``, or None if it is not this ledger's password (compared in
        constant time)."""
        keys = _derive(self.scheme, self.salt, self.iterations, bytes(password))
        return keys if hmac.compare_digest(keys.master_key, self.master_key) else None

    def stored_keys(self) -> LedgerKeys:
        """The keys, from the record alone (autorecovery, an admin: no password)."""
        return LedgerKeys(self.master_key, self.mac_key)


def _salt_bytes(scheme: str) -> int:
    return 2 * SALT_BYTES if scheme == SCHEME_PBKDF2_LEDGER else SALT_BYTES


@functools.lru_cache(maxsize=_ROOT_CACHE)
def _writer_salt(password: bytes, iterations: int) -> bytes:
    """This process's writer salt for ``password``: random, drawn at its first ledger."""
    return os.urandom(SALT_BYTES)


@functools.lru_cache(maxsize=_ROOT_CACHE)
def _pbkdf2(password: bytes, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac("sha256", password, salt, iterations)


@functools.lru_cache(maxsize=_DERIVED_CACHE)
def _derive(scheme: str, salt: bytes, iterations: int, password: bytes) -> LedgerKeys:
    if scheme == SCHEME_SHA1:
        return LedgerKeys(hashlib.sha1(b"ledger" + password).digest(),
                          hashlib.sha1(b"mac" + password).digest())
    if scheme == SCHEME_PBKDF2_LEDGER:
        root = hmac.new(_pbkdf2(password, salt[:SALT_BYTES], iterations), salt[SALT_BYTES:],
                        hashlib.sha256).digest()
    else:
        root = _pbkdf2(password, salt, iterations)
    return LedgerKeys(
        hmac.new(root, b"bkspark ledger master key", hashlib.sha256).digest()[:KEY_BYTES],
        hmac.new(root, b"bkspark ledger mac key", hashlib.sha256).digest()[:KEY_BYTES])
