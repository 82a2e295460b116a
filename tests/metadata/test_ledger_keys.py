"""What ledger metadata keeps of a password (metadata/ledger_keys.py)."""
import hashlib
import hmac

import pytest

from bkspark.errors import BadRequestError
from metadata.ledger_keys import (ITERATIONS, KEY_BYTES, MAX_ITERATIONS, SALT_BYTES,
                                  SCHEME_PBKDF2, SCHEME_PBKDF2_LEDGER, SCHEME_SHA1, KeyRecord,
                                  LedgerKeys)


def _keys(root: bytes) -> LedgerKeys:
    return LedgerKeys(
        hmac.new(root, b"bkspark ledger master key", hashlib.sha256).digest()[:20],
        hmac.new(root, b"bkspark ledger mac key", hashlib.sha256).digest()[:20])


def test_a_new_record_is_salted_per_ledger_and_holds_the_keys_not_the_password():
    a, b = KeyRecord.for_password(b"pw"), KeyRecord.for_password(b"pw")
    assert a.scheme == SCHEME_PBKDF2_LEDGER and a.iterations == ITERATIONS
    assert len(a.salt) == 2 * SALT_BYTES and a.salt != b.salt
    assert a.salt[:SALT_BYTES] == b.salt[:SALT_BYTES]     # one writer salt per process ...
    assert a.master_key != b.master_key          # ... yet one ledger's key opens no other
    keys = a.derive(b"pw")
    assert keys.master_key == a.master_key and len(keys.mac_key) == KEY_BYTES
    assert keys.mac_key != keys.master_key
    # the documented derivation, computed here independently
    root = hashlib.pbkdf2_hmac("sha256", b"pw", a.salt[:SALT_BYTES], ITERATIONS)
    assert keys == _keys(hmac.new(root, a.salt[SALT_BYTES:], hashlib.sha256).digest())
    assert a.stored_keys() == keys          # autorecovery verifies as the owner does
    assert b"pw" not in a.salt + a.master_key + a.mac_key
    shown = repr(a) + repr(keys)            # no key in a repr (logs, tracebacks)
    assert a.master_key.hex() not in shown and str(a.master_key) not in shown
    assert str(keys.mac_key) not in shown and "hidden" in repr(keys)
    other = KeyRecord.for_password(b"other")                # another password: its own salt
    assert other.salt[:SALT_BYTES] != a.salt[:SALT_BYTES]


def test_a_writers_ledgers_cost_one_pbkdf2_not_one_each(monkeypatch):
    """Creating and opening thousands of a writer's ledgers derives its root once (a PBKDF2
    is ~2.6 ms: 10,000 small ledgers read back paid 26 s of it)."""
    import metadata.ledger_keys as lk
    calls = []
    real = hashlib.pbkdf2_hmac
    monkeypatch.setattr(lk.hashlib, "pbkdf2_hmac", lambda *a: calls.append(a) or real(*a))
    lk._pbkdf2.cache_clear()
    lk._derive.cache_clear()
    records = [KeyRecord.for_password(b"many") for _ in range(2000)]
    lk._derive.cache_clear()
    assert all(r.derive(b"many") is not None for r in records)
    assert len(calls) == 1


def test_a_record_of_the_per_ledger_pbkdf2_scheme_still_opens():
    salt = bytes(range(16))
    root = hashlib.pbkdf2_hmac("sha256", b"pw", salt, ITERATIONS)
    rec = KeyRecord(SCHEME_PBKDF2, salt, ITERATIONS, *_keys(root)).validate()
    assert rec.derive(b"pw") == _keys(root) and rec.derive(b"no") is None


def test_a_wrong_password_derives_nothing():
    rec = KeyRecord.for_password(b"secret")
    assert rec.derive(b"guess") is None and rec.derive(b"") is None


def test_the_legacy_record_is_apache_bookkeepers_rule():
    rec = KeyRecord.legacy(b"pw")
    assert (rec.scheme, rec.salt, rec.iterations) == (SCHEME_SHA1, b"", 0)
    assert rec.derive(b"pw") == LedgerKeys(hashlib.sha1(b"ledgerpw").digest(),
                                           hashlib.sha1(b"macpw").digest())


@pytest.mark.parametrize("change, match", [
    (dict(scheme="md5"), "unknown scheme"),
    (dict(master_key=b"short"), "master key of 5 bytes"),
    (dict(salt=b"x" * 3), "32-byte salt"),
    (dict(salt=b"x" * 3, scheme=SCHEME_PBKDF2), "16-byte salt"),
    (dict(iterations=0), "iterations"),
    (dict(iterations=MAX_ITERATIONS + 1), "iterations"),     # a hostile record: no slow opens
    (dict(mac_key=b"k" * 19), "MAC key of 19 bytes"),
    (dict(iterations=True), "must be an int"),
    (dict(scheme=SCHEME_SHA1), "no salt"),
])
def test_invalid_records_are_refused(change, match):
    rec = KeyRecord.for_password(b"pw")
    fields = dict(scheme=rec.scheme, salt=rec.salt, iterations=rec.iterations,
                  master_key=rec.master_key, mac_key=rec.mac_key)
    fields.update(change)
    with pytest.raises(BadRequestError, match=match):
        KeyRecord(**fields).validate()
