"""What ledger metadata keeps of a password (metadata/ledger_keys.py)."""
import hashlib
import hmac

import pytest

from bkspark.errors import BadRequestError
from metadata.ledger_keys import (ITERATIONS, KEY_BYTES, MAX_ITERATIONS, SALT_BYTES,
                                  SCHEME_PBKDF2, SCHEME_SHA1, KeyRecord, LedgerKeys)


def test_a_new_record_is_salted_per_ledger_and_holds_the_keys_not_the_password():
    a, b = KeyRecord.for_password(b"pw"), KeyRecord.for_password(b"pw")
    assert a.scheme == SCHEME_PBKDF2 and a.iterations == ITERATIONS
    assert len(a.salt) == SALT_BYTES and a.salt != b.salt
    assert a.master_key != b.master_key          # one ledger's key opens no other
    keys = a.derive(b"pw")
    assert keys.master_key == a.master_key and len(keys.mac_key) == KEY_BYTES
    assert keys.mac_key != keys.master_key
    # the documented derivation, computed here independently
    root = hashlib.pbkdf2_hmac("sha256", b"pw", a.salt, ITERATIONS)
    assert keys == LedgerKeys(
        hmac.new(root, b"bkspark ledger master key", hashlib.sha256).digest()[:20],
        hmac.new(root, b"bkspark ledger mac key", hashlib.sha256).digest()[:20])
    assert a.stored_keys() == keys          # autorecovery verifies as the owner does
    assert b"pw" not in a.salt + a.master_key + a.mac_key
    shown = repr(a) + repr(keys)            # no key in a repr (logs, tracebacks)
    assert a.master_key.hex() not in shown and str(a.master_key) not in shown
    assert str(keys.mac_key) not in shown and "hidden" in repr(keys)


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
    (dict(salt=b"x" * 3), "16-byte salt"),
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
